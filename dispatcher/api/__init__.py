"""The workspace API client: typed records in and out, failures as ``ApiError``.

Modules: ``client`` (WorkspaceClient), ``records`` (response models), ``errors`` (the error tree
and the one mapping from httpx), ``paging`` (bounded iterators), ``contacts`` (exact lookup),
``shared`` (one client per process).
"""

from dispatcher.api.client import WorkspaceClient, quiet_http_logging
from dispatcher.api.contacts import find_contact_exact
from dispatcher.api.errors import (
    AccessDenied,
    ApiError,
    ApiStatusError,
    Forbidden,
    NotFound,
    NotSent,
    OutcomeUnknown,
    RateLimited,
    Rejected,
    ServerError,
    Unauthorized,
    UnexpectedResponse,
    map_errors,
)
from dispatcher.api.paging import iter_conversations, iter_messages, iter_search_results
from dispatcher.api.records import (
    Contact,
    ContactCreated,
    ContactInbox,
    Conversation,
    ConversationPage,
    Inbox,
    Message,
    MessagePage,
    MessageStatus,
    MessageType,
    SearchPage,
    Webhook,
)
from dispatcher.api.shared import close_shared_clients, shared_client

__all__ = [
    "AccessDenied",
    "ApiError",
    "ApiStatusError",
    "Contact",
    "ContactCreated",
    "ContactInbox",
    "Conversation",
    "ConversationPage",
    "Forbidden",
    "Inbox",
    "Message",
    "MessagePage",
    "MessageStatus",
    "MessageType",
    "NotFound",
    "NotSent",
    "OutcomeUnknown",
    "RateLimited",
    "Rejected",
    "SearchPage",
    "ServerError",
    "Unauthorized",
    "UnexpectedResponse",
    "Webhook",
    "WorkspaceClient",
    "close_shared_clients",
    "find_contact_exact",
    "iter_conversations",
    "iter_messages",
    "iter_search_results",
    "map_errors",
    "quiet_http_logging",
    "shared_client",
]
