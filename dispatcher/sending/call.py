"""Call: the workspace API calls of a send. Where the message goes on the slow path (inbox,
contact, source_id, conversation), createMessage itself, and the look for an earlier try's
message. No store writes: what a call's answer means is recorded by :mod:`dispatcher.sending.record`."""

from __future__ import annotations

import logging

from dispatcher.api import Message
from dispatcher.context import SendContext, call_api
from dispatcher.policy.channels import window_open as service_window_open
from dispatcher.policy.ratelimit import route_bucket
from dispatcher.sending.job import MessageBody, SendJob, Target
from dispatcher.sending.recover import find_sent_message
from dispatcher.sending.resolve import linked_conversation, resolve_contact, resolve_conversation, resolve_source_id
from dispatcher.store import queries as store

log = logging.getLogger(__name__)


def resolve_target(job: SendJob, ctx: SendContext) -> Target | None:
    """The slow path: the route's inbox, the contact (found or made), its source_id and the
    conversation (reused or made), each from the store's caches where known, else by the calls the
    contract orders (:mod:`dispatcher.sending.resolve`); and whether the customer-service window is
    open. None: the route names no inbox of the workspace."""
    inbox = ctx.inboxes.resolve(job.route)
    if inbox is None:
        return None
    contact_id, returned_source_id = resolve_contact(ctx, job.contact, inbox_id=inbox.id)
    conversation_id = linked_conversation(ctx, contact_id=contact_id, inbox_id=inbox.id)
    if conversation_id is None:
        source_id = resolve_source_id(ctx, contact_id=contact_id, inbox_id=inbox.id, returned=returned_source_id)
        conversation_id = resolve_conversation(ctx, contact_id=contact_id, inbox_id=inbox.id, source_id=source_id)
    with ctx.sessions() as session:
        last_incoming = store.last_incoming_at(session, account=ctx.settings.account, contact_id=contact_id,
                                               inbox_id=inbox.id)
    return Target(inbox_id=inbox.id, contact_id=contact_id, conversation_id=conversation_id,
                  window_open=service_window_open(last_incoming, now=ctx.clock()))


def create_message(job: SendJob, ctx: SendContext, conversation_id: int, body: MessageBody) -> Message:
    """createMessage, through the limiter (the route's own bucket too, when it has a cap). Raises
    Wait (the limiter said not now: nothing was called) or ApiError."""
    buckets = (route_bucket(job.route_name),) if job.route.max_per_minute is not None else ()
    return call_api(ctx, lambda: ctx.api.create_message(conversation_id, content=body.content,
                                                        template_params=body.template_params), *buckets)


def find_earlier_message(job: SendJob, ctx: SendContext) -> Message | None:
    """An earlier try may have sent the message: it, if it is in the conversation. Raises ApiError."""
    if job.conversation_id is None or job.content_hash is None or job.in_flight_since is None:
        return None
    message = find_sent_message(
        ctx, conversation_id=job.conversation_id, content_hash=job.content_hash, since=job.in_flight_since
    )
    if message is None:
        log.info("attempt %s: no message found after an unknown outcome; sending", job.attempt_id)
        return None
    return message
