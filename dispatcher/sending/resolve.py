"""The contract's steps 2-5 for one notification, each answered from the store when it can be.

Find or create the contact, get its source_id for the inbox, reuse or create the conversation.
Each step is resumable: what it learns is stored before the next step runs, so a worker killed
between two steps leaves the next run less to do, never something to undo. Racing workers end
on one contact (a duplicate create answers 422 and we search again), one source_id (the first
stored wins) and one conversation (a claim row lets one worker create it).
"""

from __future__ import annotations

from datetime import timedelta

from dispatcher.api import Rejected, find_contact_exact
from dispatcher.api.paging import iter_search_results
from dispatcher.context import SEARCH_BUCKET, SendContext, Wait, call_api
from dispatcher.errors import DispatcherError
from dispatcher.intake.request import ContactDetails
from dispatcher.recipients.keys import contact_keys
from dispatcher.store import queries as store


class NotContactable(DispatcherError):
    """The workspace offers no binding between the contact and the route's inbox."""


def resolve_contact(ctx: SendContext, contact: ContactDetails, *, inbox_id: int) -> tuple[int, str | None]:
    """The contact's id, and the source_id for ``inbox_id`` when createContact just returned it."""
    account = ctx.settings.account
    keys = contact_keys(contact, key=ctx.settings.hashing_key)
    with ctx.sessions() as session:
        for key in keys:
            known = store.known_contact_id(session, account=account, key=key)
            if known is not None:
                return known, None
    found = _search_once(ctx, contact)
    source_id = None
    if found is None:
        try:
            created = call_api(
                ctx,
                lambda: ctx.api.create_contact(
                    inbox_id=inbox_id,
                    name=contact.name,
                    phone_number=contact.phone_number,
                    email=contact.email,
                    identifier=contact.identifier,
                ),
            )
            contact_id, source_id = created.contact.id, created.source_id
        except Rejected:
            # A duplicate identifier, phone or e-mail: a racing worker (or the host) made it.
            exact = call_api(
                ctx,
                lambda: find_contact_exact(
                    ctx.api, identifier=contact.identifier, phone_number=contact.phone_number
                ),
                SEARCH_BUCKET,
            )
            if exact is None:
                raise
            contact_id = exact.id
    else:
        contact_id = found
    with ctx.sessions.begin() as session:
        store.remember_contact(session, account=account, keys=keys, contact_id=contact_id)
    return contact_id, source_id


def _search_once(ctx: SendContext, contact: ContactDetails) -> int | None:
    """One exact-match search: by identifier when there is one, else by phone (at most 1 page)."""
    field, value = ("identifier", contact.identifier) if contact.identifier else ("phone_number", contact.phone_number)
    if value is None:  # the request's own check needs an identifier or a phone: never reached
        return None

    def search() -> int | None:
        for candidate in iter_search_results(ctx.api, value, max_pages=1):
            if getattr(candidate, field) == value:
                return candidate.id
        return None

    return call_api(ctx, search, SEARCH_BUCKET)


def resolve_source_id(ctx: SendContext, *, contact_id: int, inbox_id: int, returned: str | None) -> str:
    """The stored source_id for the pair; else the one createContact returned, else the listed one."""
    account = ctx.settings.account
    with ctx.sessions() as session:
        known = store.known_source_id(session, account=account, contact_id=contact_id, inbox_id=inbox_id)
    if known is not None:
        return known
    source_id = returned
    if source_id is None:
        entries = call_api(ctx, lambda: ctx.api.list_contactable_inboxes(contact_id))
        source_id = next((entry.source_id for entry in entries if entry.inbox and entry.inbox.id == inbox_id), None)
        if source_id is None:
            raise NotContactable(f"contact {contact_id} has no binding to inbox {inbox_id}")
    with ctx.sessions.begin() as session:
        return store.remember_source_id(
            session, account=account, contact_id=contact_id, inbox_id=inbox_id, source_id=source_id
        )


def linked_conversation(ctx: SendContext, *, contact_id: int, inbox_id: int) -> int | None:
    """The pair's conversation when it is linked already: then no source_id is needed (a linked
    pair keeps only a mark for it, and listing the contact's inboxes for one would be a call for
    nothing: 0.04 to 0.09 a notification under faults, docs/benchmarks.md)."""
    with ctx.sessions() as session:
        link = store.conversation_link(session, account=ctx.settings.account, contact_id=contact_id, inbox_id=inbox_id)
    return link.conversation_id if link is not None else None


def resolve_conversation(ctx: SendContext, *, contact_id: int, inbox_id: int, source_id: str) -> int:
    """The pair's conversation, created once: one worker claims the right, the others wait."""
    account, pair = ctx.settings.account, {"contact_id": contact_id, "inbox_id": inbox_id}
    now = ctx.clock()
    with ctx.sessions.begin() as session:
        link = store.conversation_link(session, account=account, **pair)
        if link is not None and link.conversation_id is not None:
            return link.conversation_id
        # The claim outlasts one createConversation call (its whole HTTP budget), no more.
        claim_s = ctx.settings.http_budget_s
        wait_s = store.claim_conversation(session, account=account, **pair, now=now, until=now + timedelta(seconds=claim_s))
    if wait_s > 0:
        raise Wait(wait_s + ctx.rng.uniform(0.1, 0.5), "another worker is creating this conversation")
    try:
        conversation = call_api(
            ctx, lambda: ctx.api.create_conversation(source_id=source_id, inbox_id=inbox_id, contact_id=contact_id)
        )
    except BaseException:
        with ctx.sessions.begin() as session:
            store.release_conversation_claim(session, account=account, **pair)
        raise
    with ctx.sessions.begin() as session:
        store.link_conversation(session, account=account, **pair, conversation_id=conversation.id)
    return conversation.id
