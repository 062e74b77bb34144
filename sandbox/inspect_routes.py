"""Inspection and control endpoints under ``/_sandbox/``, apart from the contract paths.

No token: these stand for what a tester can see and do on the real workspace's side (its agent UI,
a customer typing a reply), not for anything the dispatcher may call. They are never faulted.
"""

from __future__ import annotations

import json
import os

import pydantic
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandbox import shapes
from sandbox.bodies import Incoming, OptOuts, RevokeToken, describe_errors
from sandbox.records import NotFound
from sandbox.responses import HttpError, int_query, json_error, parse_body
from sandbox.runtime import Sandbox

MESSAGE_FILTERS = ("account_id", "conversation_id", "inbox_id", "contact_id")


def _sandbox(request: Request) -> Sandbox:
    return request.app.state.sandbox  # type: ignore[no-any-return]


async def health(request: Request) -> Response:
    # the pid lets whoever started this process tell it from another sandbox that holds the port
    return JSONResponse({"status": "ok", "pid": os.getpid(), "pending_webhooks": _sandbox(request).webhooks.pending()})


async def messages(request: Request) -> Response:
    """All messages, oldest first; filter by account_id, conversation_id (display id), inbox_id,
    contact_id, status."""
    sandbox = _sandbox(request)
    try:
        wanted = {name: int_query(request, name) for name in MESSAGE_FILTERS}
    except HttpError as exc:
        return json_error(exc.status, exc.message)
    status = request.query_params.get("status")
    rows = []
    for message in sandbox.store.messages.values():
        row = sandbox.inspect_message(message)
        if any(value is not None and row[name] != value for name, value in wanted.items()):
            continue
        if status is not None and row["status"] != status:
            continue
        rows.append(row)
    return JSONResponse({"messages": rows})


async def stats(request: Request) -> Response:
    sandbox = _sandbox(request)
    return JSONResponse({**sandbox.stats.snapshot(), "pending_webhooks": sandbox.webhooks.pending()})


async def faults(request: Request) -> Response:
    sandbox = _sandbox(request)
    if request.method == "PUT":
        try:
            raw = json.loads(await request.body())
            if not isinstance(raw, dict):
                raise ValueError("the fault table must be a JSON object")
            sandbox.faults.replace(raw)
        except pydantic.ValidationError as exc:
            return json_error(422, "Invalid fault settings", details=describe_errors(exc.errors()))
        except ValueError as exc:
            return json_error(422, str(exc))
    return JSONResponse({"faults": sandbox.faults.snapshot()})


async def incoming(request: Request) -> Response:
    """Simulate a customer's message on a contact/inbox pair (finds or opens the conversation)."""
    sandbox = _sandbox(request)
    try:
        body = await parse_body(request, Incoming)
        store = sandbox.store
        if body.account_id not in store.accounts:
            raise NotFound("Account not found")
        if body.conversation_id is not None:
            conversation = store.conversation(body.account_id, body.conversation_id)
            if body.contact_id not in (None, conversation.contact_id) or body.inbox_id not in (None, conversation.inbox_id):
                raise HttpError(422, "conversation belongs to another contact or inbox")
        else:
            assert body.contact_id is not None and body.inbox_id is not None  # the body's own rule
            contact = store.contact(body.account_id, body.contact_id)
            inbox = store.inbox(body.account_id, body.inbox_id)
            latest = [c for c in store.conversations.values() if c.contact_id == contact.id and c.inbox_id == inbox.id]
            if latest:
                conversation = latest[-1]
            else:
                source_id = store.contactable_source_id(contact, inbox)
                if source_id is None:
                    raise HttpError(422, "the contact has no address on this inbox's channel")
                binding = store.bind(contact, inbox, source_id)
                conversation, _ = store.create_conversation(
                    body.account_id, binding, status="open", custom_attributes={}, additional_attributes={}
                )
                sandbox.announce_conversation(conversation)
    except HttpError as exc:
        return json_error(exc.status, exc.message, **exc.extra)
    except NotFound as exc:
        return json_error(404, str(exc))
    message = sandbox.receive_message(conversation, content=body.content, age_s=body.age_s)
    return JSONResponse(
        {"conversation_id": conversation.display_id, "message": shapes.message_json(sandbox.store, message)}
    )


async def opt_outs(request: Request) -> Response:
    """Set a contact's opt-outs on the channels' side; answers them as they now are."""
    sandbox = _sandbox(request)
    try:
        body = await parse_body(request, OptOuts)
        contact = sandbox.store.contact(body.account_id, body.contact_id)
    except HttpError as exc:
        return json_error(exc.status, exc.message, **exc.extra)
    except NotFound as exc:
        return json_error(404, str(exc))
    if body.sms_opted_out is not None:
        contact.sms_opted_out = body.sms_opted_out
    if body.marketing_opted_out is not None:
        contact.marketing_opted_out = body.marketing_opted_out
    sandbox.store.save_contact(contact)
    return JSONResponse({"contact_id": contact.id, "sms_opted_out": contact.sms_opted_out,
                         "marketing_opted_out": contact.marketing_opted_out})


async def revoke_token(request: Request) -> Response:
    """Revoke an API access token, as the workspace's admin does: every call with it answers 401
    until ``/_sandbox/reset`` or a restart (the configured tokens are not journaled). The answer
    names no token."""
    sandbox = _sandbox(request)
    try:
        body = await parse_body(request, RevokeToken)
    except HttpError as exc:
        return json_error(exc.status, exc.message, **exc.extra)
    if sandbox.store.token_accounts.pop(body.token, None) is None:
        return json_error(404, "no such token")
    return JSONResponse({"revoked": True})


async def reset(request: Request) -> Response:
    _sandbox(request).reset()
    return JSONResponse({"status": "reset"})


routes = [
    Route("/_sandbox/health", health, methods=["GET"]),
    Route("/_sandbox/messages", messages, methods=["GET"]),
    Route("/_sandbox/stats", stats, methods=["GET"]),
    Route("/_sandbox/faults", faults, methods=["GET", "PUT"]),
    Route("/_sandbox/incoming", incoming, methods=["POST"]),
    Route("/_sandbox/opt-outs", opt_outs, methods=["POST"]),
    Route("/_sandbox/tokens/revoke", revoke_token, methods=["POST"]),
    Route("/_sandbox/reset", reset, methods=["POST"]),
]
