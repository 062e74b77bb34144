"""WorkspaceClient: one typed method per contract operation, records out, ApiError on failure.

Guarantees:

* At most one HTTP request per call. Nothing is retried here, reads included: the API has no
  idempotency key, so retry policy (and the check before resending after an ambiguous
  failure) belongs to ``dispatcher.policy`` and the send path.
* The token travels only in the ``api_access_token`` header, added per request by an
  ``httpx.Auth``; it is never in a URL, a log line, a repr or an exception. Redirects are not
  followed, so the header never reaches another host.
* Query values go through ``params=`` and are percent-encoded (a ``+`` becomes ``%2B``).
* Logs: operation and status at DEBUG, never URLs or bodies; httpx's own loggers are held at
  WARNING because at INFO they log every URL, and contact search puts the phone in the query.

``base_url`` is the workspace root WITHOUT ``/api/v1`` (a trailing slash is fine); the client
adds ``/api/v1/accounts/{account_id}``. A base_url that already contains ``/api/v1`` is refused
with ValueError rather than stripped, so a misread setting fails at start-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from pydantic import SecretStr

from dispatcher import tracing
from dispatcher.api.errors import ApiError, Context, UnexpectedResponse, map_errors
from dispatcher.api.records import (
    ContactCreated,
    ContactInbox,
    Conversation,
    ConversationPage,
    Inbox,
    Message,
    MessagePage,
    SearchPage,
    Webhook,
    parse_list,
)
from dispatcher.faults import crash_point

__all__ = ["DEFAULT_TIMEOUT", "CONVERSATION_STATUSES", "WEBHOOK_SUBSCRIPTIONS",
           "WorkspaceClient", "quiet_http_logging"]

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: Seconds. Connect and pool waits are short (the request has not left yet); read and write
#: allow a slow workspace. Units: seconds, as httpx takes them.
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=20.0, write=20.0, pool=5.0)
CONVERSATION_STATUSES = frozenset({"all", "open", "resolved", "pending", "snoozed"})
_CREATE_STATUSES = frozenset({"open", "resolved", "pending"})
WEBHOOK_SUBSCRIPTIONS = frozenset({
    "conversation_created", "conversation_status_changed", "conversation_updated",
    "message_created", "message_updated", "contact_created", "contact_updated",
})
_TEMPLATE_KEYS = ("name", "category", "language", "processed_params")


def quiet_http_logging() -> None:
    """Hold the ``httpx`` and ``httpcore`` loggers at WARNING or above (they log URLs)."""
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:  # NOTSET (0) inherits, and may inherit INFO
            logger.setLevel(logging.WARNING)


quiet_http_logging()


class _TokenAuth(httpx.Auth):
    """Adds the token header to each request; keeps it out of the client's default headers."""

    def __init__(self, token: SecretStr) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["api_access_token"] = self._token.get_secret_value()
        yield request

    def __repr__(self) -> str:
        return "_TokenAuth(token='**********')"


def _base_url(value: str) -> str:
    url = httpx.URL(str(value).strip())
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("base_url must be an absolute http(s) URL")
    if url.userinfo or url.query or url.fragment:
        raise ValueError("base_url must not carry credentials, a query or a fragment")
    path = url.path.rstrip("/")
    if "/api/v1" in f"{path}/":
        raise ValueError("base_url must not include /api/v1: "
                         "the client adds /api/v1/accounts/{account_id} itself")
    return str(url.copy_with(path=path or "/")).rstrip("/")


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer")
    return value


def _optional_id(name: str, value: int | None) -> int | None:
    return None if value is None else _positive_int(name, value)


def _token(value: SecretStr | str) -> SecretStr:
    secret = value if isinstance(value, SecretStr) else SecretStr(value)
    text = secret.get_secret_value()
    if not text or not text.isascii() or not text.isprintable() or text != text.strip():
        raise ValueError("api_token must be non-empty printable ASCII without surrounding spaces")
    return secret


class WorkspaceClient:
    """The workspace API for one account over one pooled ``httpx.Client``.

    ``transport`` is the seam for tests and the sandbox (``httpx.MockTransport``); when it is
    given, ``max_connections`` does not apply. Thread-safe as httpx.Client is; not fork-safe:
    use :func:`dispatcher.api.shared.shared_client` in workers.
    """

    def __init__(self, *, base_url: str, account_id: int, api_token: SecretStr | str,
                 timeout: httpx.Timeout | None = None, transport: httpx.BaseTransport | None = None,
                 max_connections: int = 20) -> None:
        quiet_http_logging()
        self.base_url = _base_url(base_url)
        self.account_id = _positive_int("account_id", account_id)
        _positive_int("max_connections", max_connections)
        self._http = httpx.Client(
            base_url=f"{self.base_url}/api/v1/accounts/{self.account_id}",
            auth=_TokenAuth(_token(api_token)),
            timeout=timeout or DEFAULT_TIMEOUT,
            transport=transport,
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections),
            headers={"accept": "application/json"},
            follow_redirects=False,
        )

    @classmethod
    def from_settings(cls, settings: Any, *, transport: httpx.BaseTransport | None = None) -> Self:
        """A client from the dispatcher settings (duck-typed; timeouts in seconds)."""
        timeout = httpx.Timeout(connect=float(settings.http_connect_timeout_s),
                                read=float(settings.http_read_timeout_s),
                                write=float(settings.http_write_timeout_s),
                                pool=float(settings.http_pool_timeout_s))
        return cls(base_url=str(settings.api_url), account_id=int(settings.account_id),
                   api_token=settings.api_token, timeout=timeout, transport=transport,
                   max_connections=int(settings.http_max_connections))

    def __repr__(self) -> str:
        return f"WorkspaceClient(base_url={self.base_url!r}, account_id={self.account_id})"

    def close(self) -> None:
        """Close the pooled connections. Idempotent."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- the one place a request is made ---------------------------------------------------

    def _call(self, operation: str, method: str, path: str, parse: Callable[[Any], T], *,
              params: Mapping[str, Any] | None = None, json: Any = None,
              context: Context | None = None) -> T:
        started = time.monotonic()
        response: httpx.Response | None = None
        crash_point("before", operation)
        try:
            # The span names the operation and the status code only: a URL may hold a phone number.
            with map_errors(operation, context=context), \
                    tracing.child(f"workspace {operation}", {"dispatcher.operation": operation}) as span:
                response = self._http.request(method, path, params=params, json=json)
                crash_point("after", operation)  # the workspace did its part; the answer is lost with us
                tracing.set_attribute(span, "http.response.status_code", response.status_code)
                _log.debug("%s -> HTTP %s in %.0f ms", operation, response.status_code,
                           (time.monotonic() - started) * 1000)
                response.raise_for_status()
                return parse(response.json())
        except ApiError as error:
            if isinstance(error, UnexpectedResponse) and response is not None:
                error.status_code = response.status_code
            _log.debug("%s", error)  # str(ApiError) holds only operation, status and IDs
            raise

    # -- the ten operations ----------------------------------------------------------------

    def list_inboxes(self) -> list[Inbox]:
        """listInboxes: every inbox of the account."""
        return self._call("listInboxes", "GET", "/inboxes", lambda b: parse_list(Inbox, b))

    def search_contacts(self, q: str, *, page: int = 1) -> SearchPage:
        """searchContacts: a SUBSTRING match over name, identifier, e-mail and phone; pick the
        exact match yourself (``dispatcher.api.contacts.find_contact_exact``)."""
        if not q:
            raise ValueError("q must not be empty")
        _positive_int("page", page)
        return self._call("searchContacts", "GET", "/contacts/search", SearchPage.model_validate,
                          params={"q": q, "page": page})

    def create_contact(self, *, inbox_id: int, name: str | None = None,
                       phone_number: str | None = None, email: str | None = None,
                       identifier: str | None = None,
                       additional_attributes: Mapping[str, Any] | None = None) -> ContactCreated:
        """createContact in ``inbox_id``. A duplicate identifier, e-mail or phone answers 422
        (:class:`Rejected`): search again, another worker created it."""
        body = _without_none({"inbox_id": _positive_int("inbox_id", inbox_id), "name": name,
                              "phone_number": phone_number, "email": email,
                              "identifier": identifier,
                              "additional_attributes": _dict_or_none(additional_attributes)})
        return self._call("createContact", "POST", "/contacts", ContactCreated.model_validate,
                          json=body, context={"inbox_id": inbox_id})

    def list_contactable_inboxes(self, contact_id: int) -> list[ContactInbox]:
        """listContactableInboxes. For API inboxes the service invents a new source_id on each
        call: store the first one you use."""
        _positive_int("contact_id", contact_id)
        return self._call("listContactableInboxes", "GET",
                          f"/contacts/{contact_id}/contactable_inboxes",
                          lambda b: parse_list(ContactInbox, b), context={"contact_id": contact_id})

    def list_conversations(self, *, inbox_id: int | None = None, status: str = "open",
                           page: int = 1) -> ConversationPage:
        """listConversations, 25 a page; ``status`` one of CONVERSATION_STATUSES."""
        if status not in CONVERSATION_STATUSES:
            raise ValueError(f"status must be one of {sorted(CONVERSATION_STATUSES)}")
        params: dict[str, Any] = {"status": status, "page": _positive_int("page", page)}
        if inbox_id is not None:
            params["inbox_id"] = _positive_int("inbox_id", inbox_id)
        return self._call("listConversations", "GET", "/conversations",
                          ConversationPage.model_validate, params=params,
                          context={"inbox_id": inbox_id} if inbox_id is not None else None)

    def create_conversation(self, *, source_id: str, inbox_id: int | None = None,
                            contact_id: int | None = None, status: str | None = None,
                            custom_attributes: Mapping[str, Any] | None = None) -> Conversation:
        """createConversation. Each call opens a NEW thread: reuse one per contact and inbox."""
        if not source_id:
            raise ValueError("source_id must not be empty")
        if status is not None and status not in _CREATE_STATUSES:
            raise ValueError(f"status must be one of {sorted(_CREATE_STATUSES)}")
        body = _without_none({"source_id": source_id,
                              "inbox_id": _optional_id("inbox_id", inbox_id),
                              "contact_id": _optional_id("contact_id", contact_id), "status": status,
                              "custom_attributes": _dict_or_none(custom_attributes)})
        context = _without_none({"inbox_id": inbox_id, "contact_id": contact_id})
        return self._call("createConversation", "POST", "/conversations",
                          Conversation.model_validate, json=body, context=context)

    def list_messages(self, conversation_id: int, *, before: int | None = None,
                      after: int | None = None) -> MessagePage:
        """listMessages: the latest 20, or 20 before / after a message id."""
        _positive_int("conversation_id", conversation_id)
        params = _without_none({"before": _optional_id("before", before),
                                "after": _optional_id("after", after)})
        return self._call("listMessages", "GET", f"/conversations/{conversation_id}/messages",
                          MessagePage.model_validate, params=params or None,
                          context={"conversation_id": conversation_id})

    def create_message(self, conversation_id: int, *, content: str,
                       template_params: Mapping[str, Any] | None = None,
                       private: bool = False) -> Message:
        """createMessage, outgoing. 200 means accepted, not delivered. Never retried here and
        never given a source_id (the service would take it for an incoming message)."""
        _positive_int("conversation_id", conversation_id)
        body: dict[str, Any] = {"content": content, "message_type": "outgoing",
                                "private": bool(private)}
        if template_params is not None:
            missing = [key for key in _TEMPLATE_KEYS if key not in template_params]
            if missing:
                raise ValueError(f"template_params lacks {missing}")
            body["template_params"] = dict(template_params)
        return self._call("createMessage", "POST", f"/conversations/{conversation_id}/messages",
                          Message.model_validate, json=body,
                          context={"conversation_id": conversation_id})

    def list_webhooks(self) -> list[Webhook]:
        """listWebhooks (the list carries no secrets)."""
        return self._call("listWebhooks", "GET", "/webhooks",
                          lambda b: parse_list(Webhook, b, "payload", "webhooks"))

    def create_webhook(self, *, url: str, subscriptions: list[str] | tuple[str, ...],
                       name: str | None = None, inbox_id: int | None = None) -> Webhook:
        """createWebhook; the returned record's ``secret`` signs deliveries: store it."""
        unknown = [s for s in subscriptions if s not in WEBHOOK_SUBSCRIPTIONS]
        if not subscriptions or unknown:
            raise ValueError(f"subscriptions must be a non-empty subset of {sorted(WEBHOOK_SUBSCRIPTIONS)}")
        if not url:
            raise ValueError("url must not be empty")
        webhook = _without_none({"url": url, "subscriptions": list(subscriptions), "name": name,
                                 "inbox_id": _optional_id("inbox_id", inbox_id)})
        return self._call("createWebhook", "POST", "/webhooks", Webhook.model_validate,
                          json={"webhook": webhook},
                          context={"inbox_id": inbox_id} if inbox_id is not None else None)


def _without_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _dict_or_none(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return dict(value) if value is not None else None
