"""Exact contact lookup over the service's substring search.

searchContacts matches substrings of name, e-mail, phone and identifier, so ``+1555123``
also finds ``+15551234``. We search by our stable identifier first and accept only a contact
whose ``identifier`` equals it; then by the E.164 phone and accept only an equal
``phone_number``. Each search is bounded by ``max_pages`` (see ``dispatcher.api.paging``):
None means "not found within the bound"; a later createContact that answers 422 (duplicate)
is the backstop, after which searching again finds the contact.
"""

from __future__ import annotations

import re

from dispatcher.api.client import WorkspaceClient
from dispatcher.api.paging import iter_search_results
from dispatcher.api.records import Contact

__all__ = ["E164", "find_contact_exact"]

#: E.164: a plus, a non-zero digit, at most 15 digits in all.
E164 = re.compile(r"\+[1-9][0-9]{1,14}")


def find_contact_exact(client: WorkspaceClient, *, identifier: str | None = None,
                       phone_number: str | None = None, max_pages: int = 5) -> Contact | None:
    """The contact whose identifier (first) or E.164 phone (then) equals the given value."""
    if not identifier and not phone_number:
        raise ValueError("give identifier, phone_number or both")
    if phone_number is not None and not E164.fullmatch(phone_number):
        raise ValueError("phone_number must be in E.164 form (+ and up to 15 digits)")
    if identifier:
        for contact in iter_search_results(client, identifier, max_pages=max_pages):
            if contact.identifier == identifier:
                return contact
    if phone_number:
        for contact in iter_search_results(client, phone_number, max_pages=max_pages):
            if contact.phone_number == phone_number:
                return contact
    return None
