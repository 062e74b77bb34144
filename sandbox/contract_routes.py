"""The ten contract operations under ``/api/v1/accounts/{account_id}``.

Each handler is wrapped by :func:`operation`, which in order: counts the call, applies the faults
configured for its operationId (latency, timeout, 429, 5xx), checks the token (401 unknown or
missing, 404 unknown account, 401 or 403 (by profile) no access), runs the handler, and finally applies a "drop the
response" fault to a successful answer. Handlers never await between reading and writing the store.

Status choices where the contract leaves room (also in docs/sandbox.md): path ids that do not exist
-> 404; ids inside a body that the account does not know (inbox_id, contact_id, source_id) -> 404;
a body that is not a JSON object or a bad query parameter -> 400; a body that breaks the schema,
a source_id bound to another contact, "Too many messages" -> 422. Where the profile decides
(sandbox/profiles.py): a duplicate contact (stock 422, contract 400), a token without access to
the account (stock 401, contract 403), a webhook URL the account already has (stock 422), a flat
createWebhook body (stock takes it), a "+" in a platform source_id (stock 422, contract 404).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandbox import shapes
from sandbox.bodies import ContactCreate, ConversationCreate, MessageCreate, WebhookCreate
from sandbox.config import CHANNEL_PLATFORM
from sandbox.faults import DroppedResponse
from sandbox.records import ContactRec, NotFound, Unprocessable
from sandbox.responses import (
    HttpError,
    int_query,
    json_error,
    parse_body,
    read_json_object,
    retry_later,
    validate_model,
    validation_error,
)
from sandbox.runtime import OverSendCap, Sandbox
from sandbox.state import RANDOM_ID_CHANNELS

Handler = Callable[[Request, Sandbox, int], Awaitable[Response]]
CONTACTS_PAGE, CONVERSATIONS_PAGE = 15, 25
CONVERSATION_FILTERS = ("all", "open", "resolved", "pending", "snoozed")
PLATFORM_SOURCE_ID = re.compile(r"\d{1,15}")  # the platform's contact address: digits, no "+"
log = logging.getLogger("sandbox.api")  # operation names and statuses only, never values


def _authorise(request: Request, sandbox: Sandbox, account_id: int) -> Response | None:
    dialect = sandbox.config.dialect
    token = request.headers.get("api_access_token")
    if not token:
        if dialect.missing_token_body == "devise":
            return JSONResponse({"errors": ["You need to sign in or sign up before continuing."]}, status_code=401)
        return json_error(401, "Invalid Access Token")
    reachable = sandbox.store.token_accounts.get(token)
    if reachable is None:
        return json_error(401, "Invalid Access Token")
    if account_id not in sandbox.store.accounts:
        return json_error(404, "Account not found")
    if account_id not in reachable:
        return json_error(dialect.no_access_status, "You are not authorized to access this account")
    return None


def operation(operation_id: str) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    def wrap(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            sandbox: Sandbox = request.app.state.sandbox
            sandbox.stats.count_call(operation_id)
            log.debug("call %s", operation_id)
            fault = sandbox.faults.get(operation_id)
            outcome = "pass"
            if fault is not None:
                if fault.latency_s:
                    await asyncio.sleep(fault.latency_s)
                outcome = sandbox.faults.draw(fault)
                if outcome != "pass":
                    sandbox.stats.count_fault(operation_id, outcome)
                if outcome == "timeout":
                    await request.body()  # read (and cache) it now: the client may be gone later
                    await asyncio.sleep(fault.timeout_s)
                    if fault.timeout_then == "close":
                        return DroppedResponse()
                elif outcome == "rate_limit":
                    return retry_later()
                elif outcome == "server_error":
                    return json_error(fault.server_error_status, "Internal server error")
            account_id: int = request.path_params["account_id"]
            refusal = _authorise(request, sandbox, account_id)
            if refusal is not None:
                return refusal
            try:
                response = await handler(request, sandbox, account_id)
            except HttpError as exc:
                return json_error(exc.status, exc.message, **exc.extra)
            except NotFound as exc:
                return json_error(404, str(exc))
            except Unprocessable as exc:
                if exc.attributes:  # a record the service refused as invalid
                    return validation_error(sandbox.config.dialect, str(exc), exc.attributes, status=exc.status)
                return json_error(422, str(exc))
            except OverSendCap:
                return retry_later()
            if outcome == "drop" and fault is not None and response.status_code < 300:
                if fault.drop_mode == "hang":
                    await asyncio.sleep(fault.hang_s)
                    return response
                return DroppedResponse()
            return response

        endpoint.__name__ = operation_id
        return endpoint

    return wrap


@operation("listInboxes")
async def list_inboxes(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    return JSONResponse({"payload": [shapes.inbox_json(i) for i in sandbox.store.inboxes_of(account_id)]})


@operation("searchContacts")
async def search_contacts(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    query = request.query_params.get("q")
    if query is None:
        raise HttpError(400, "q is required")
    page = int_query(request, "page", default=1, minimum=1) or 1
    if sandbox.searches_exhausted(account_id):
        return retry_later()
    found = sandbox.store.search_contacts(account_id, query)
    start = (page - 1) * CONTACTS_PAGE
    rows = found[start : start + CONTACTS_PAGE]
    # Stock echoes the page parameter as it came (a string); without one it reports the integer 1.
    given = "page" in request.query_params and sandbox.config.dialect.current_page == "int_then_string"
    meta = {"count": len(rows), "current_page": str(page) if given else page, "has_more": len(found) > start + CONTACTS_PAGE}
    return JSONResponse({"meta": meta, "payload": [shapes.contact_json(c) for c in rows]})


@operation("createContact")
async def create_contact(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    body = await parse_body(request, ContactCreate)
    store = sandbox.store
    inbox = store.inbox(account_id, body.inbox_id)
    if inbox.channel_type not in RANDOM_ID_CHANNELS:  # check the address before creating anything
        if store.derived_source_id(_probe(body), inbox) is None:
            field = "email" if inbox.channel_type.endswith("Email") else "phone_number"
            raise Unprocessable(f"{field} is required for this inbox", attributes=[field])
    try:
        contact = store.create_contact(
            account_id,
            name=body.name,
            phone_number=body.phone_number,
            email=body.email,
            identifier=body.identifier,
            additional_attributes=body.additional_attributes,
        )
    except Unprocessable as exc:
        exc.status = sandbox.config.dialect.duplicate_contact_status  # field notes 422, contract 400
        raise
    binding = store.bind_for_creation(contact, inbox)
    sandbox.announce_contact(contact)
    contact_inbox = {"inbox": shapes.inbox_json(inbox), "source_id": binding.source_id}
    return JSONResponse({"payload": {"contact": shapes.contact_json(contact), "contact_inbox": contact_inbox}})


def _probe(body: ContactCreate) -> ContactRec:
    """A stand-in contact to ask which address a channel would use, before storing anything."""
    return ContactRec(0, 0, body.name, body.phone_number, body.email, body.identifier, {}, 0.0)


@operation("listContactableInboxes")
async def list_contactable_inboxes(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    store = sandbox.store
    contact = store.contact(account_id, request.path_params["contact_id"])
    entries = []
    for inbox in store.inboxes_of(account_id):
        source_id = store.contactable_source_id(contact, inbox)
        if source_id is not None:
            entries.append({"source_id": source_id, "inbox": shapes.inbox_json(inbox)})
    return JSONResponse({"payload": entries})


@operation("listConversations")
async def list_conversations(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    inbox_id = int_query(request, "inbox_id")
    status = request.query_params.get("status") or "open"
    if status not in CONVERSATION_FILTERS:
        raise HttpError(400, "status is not a known filter")
    page = int_query(request, "page", default=1, minimum=1) or 1
    rows = sandbox.store.list_conversations(account_id, inbox_id=inbox_id, status=status)
    start = (page - 1) * CONVERSATIONS_PAGE
    meta = {"mine_count": 0, "assigned_count": 0, "unassigned_count": len(rows), "all_count": len(rows)}
    payload = [shapes.conversation_json(sandbox.store, c) for c in rows[start : start + CONVERSATIONS_PAGE]]
    return JSONResponse({"data": {"meta": meta, "payload": payload}})


@operation("createConversation")
async def create_conversation(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    body = await parse_body(request, ConversationCreate)
    store = sandbox.store
    inbox = store.inbox(account_id, body.inbox_id) if body.inbox_id is not None else None
    contact = store.contact(account_id, body.contact_id) if body.contact_id is not None else None
    if inbox is not None and inbox.channel_type == CHANNEL_PLATFORM and not PLATFORM_SOURCE_ID.fullmatch(body.source_id):
        status = sandbox.config.dialect.platform_source_id_format_status
        if status == 422:  # the stock service validates the address format before anything else
            raise Unprocessable("Source invalid source id for whatsapp inbox", attributes=["source_id"])
    binding = store.find_binding(account_id, body.source_id, inbox.id if inbox else None)
    if binding is None:
        # The real service binds a source_id it has not seen when contact and inbox are named and
        # the id fits the channel: any id for an API inbox (listContactableInboxes invented it),
        # else exactly the channel address.
        if contact is None or inbox is None:
            raise NotFound("Contact inbox not found for this source_id")
        expected = store.derived_source_id(contact, inbox)
        if inbox.channel_type not in RANDOM_ID_CHANNELS and body.source_id != expected:
            raise NotFound("Contact inbox not found for this source_id")
        binding = store.bind(contact, inbox, body.source_id)
    elif contact is not None and binding.contact_id != contact.id:
        raise Unprocessable("source_id belongs to another contact", attributes=["source_id"])
    conversation, created = store.create_conversation(
        account_id,
        binding,
        status=body.status,
        custom_attributes=body.custom_attributes or {},
        additional_attributes=body.additional_attributes or {},
    )
    if created:
        sandbox.announce_conversation(conversation)
    if body.message is not None:
        first = body.message
        sandbox.send_message(
            conversation,
            content=first.content,
            message_type=first.message_type,
            private=first.private,
            template_params=first.template_params.model_dump() if first.template_params else None,
            source_id=first.source_id,
        )
    return JSONResponse(shapes.conversation_json(store, conversation))


@operation("listMessages")
async def list_messages(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    store = sandbox.store
    conversation = store.conversation(account_id, request.path_params["conversation_id"])
    before = int_query(request, "before")
    after = int_query(request, "after")
    rows = store.page_messages(conversation, before=before, after=after)
    meta: dict[str, object] = {
        "labels": [],
        "additional_attributes": dict(conversation.additional_attributes),
        "contact": shapes.contact_json(store.contacts[conversation.contact_id]),
        "assignee": None,
    }
    return JSONResponse({"meta": meta, "payload": [shapes.message_json(store, m) for m in rows]})


@operation("createMessage")
async def create_message(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    conversation = sandbox.store.conversation(account_id, request.path_params["conversation_id"])
    body = await parse_body(request, MessageCreate)
    message = sandbox.send_message(
        conversation,
        content=body.content,
        message_type=body.message_type,
        private=body.private,
        template_params=body.template_params.model_dump() if body.template_params else None,
        source_id=body.source_id,
    )
    return JSONResponse(shapes.message_json(sandbox.store, message))


@operation("listWebhooks")
async def list_webhooks(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    hooks = [shapes.webhook_json(h) for h in sandbox.store.webhooks.values() if h.account_id == account_id]
    return JSONResponse({"payload": {"webhooks": hooks}})


@operation("createWebhook")
async def create_webhook(request: Request, sandbox: Sandbox, account_id: int) -> Response:
    dialect = sandbox.config.dialect
    data = await read_json_object(request)
    if dialect.flat_webhook_body and "webhook" not in data and "url" in data:
        data = {"webhook": data}  # stock takes the fields unwrapped too
    spec = validate_model(WebhookCreate, data).webhook
    if spec.inbox_id is not None:
        sandbox.store.inbox(account_id, spec.inbox_id)
    if dialect.duplicate_webhook_url_refused and any(
        h.account_id == account_id and h.url == spec.url for h in sandbox.store.webhooks.values()
    ):
        raise Unprocessable("Url has already been taken", attributes=["url"])
    hook = sandbox.store.create_webhook(
        account_id, url=spec.url, name=spec.name, inbox_id=spec.inbox_id, subscriptions=list(spec.subscriptions)
    )
    return JSONResponse({"payload": {"webhook": shapes.webhook_json(hook)}})


def by_method(**handlers: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """One route per path, so a 405 answer's ``Allow`` header lists every method of the path."""

    async def endpoint(request: Request) -> Response:
        return await handlers[request.method](request)

    return endpoint


BASE = "/api/v1/accounts/{account_id:int}"
CONVERSATION_MESSAGES = f"{BASE}/conversations/{{conversation_id:int}}/messages"
routes = [
    Route(f"{BASE}/inboxes", list_inboxes, methods=["GET"]),
    Route(f"{BASE}/contacts/search", search_contacts, methods=["GET"]),
    Route(f"{BASE}/contacts", create_contact, methods=["POST"]),
    Route(f"{BASE}/contacts/{{contact_id:int}}/contactable_inboxes", list_contactable_inboxes, methods=["GET"]),
    Route(
        f"{BASE}/conversations",
        by_method(GET=list_conversations, HEAD=list_conversations, POST=create_conversation),
        methods=["GET", "POST"],
    ),
    Route(
        CONVERSATION_MESSAGES,
        by_method(GET=list_messages, HEAD=list_messages, POST=create_message),
        methods=["GET", "POST"],
    ),
    Route(f"{BASE}/webhooks", by_method(GET=list_webhooks, HEAD=list_webhooks, POST=create_webhook), methods=["GET", "POST"]),
]
