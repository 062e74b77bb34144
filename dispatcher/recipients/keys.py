"""A recipient's keys: keyed hashes of its normalised identifier, phone number and e-mail address.

The same hashes as the contact cache's (:func:`dispatcher.store.queries.identity_key`), so an
opt-out recorded by phone number matches a notification sent by the host's identifier once the
contact is known, and neither can be read back from the store.
"""

from __future__ import annotations

from dispatcher.recipients.contact import ContactDetails
from dispatcher.store.queries import identity_key


def recipient_keys(*, key: bytes, identifier: str | None = None, phone_number: str | None = None,
                   email: str | None = None) -> list[str]:
    keys = []
    if identifier:
        keys.append(identity_key(key=key, identifier=identifier.strip()))
    if phone_number:
        keys.append(identity_key(key=key, phone_number=phone_number.strip()))
    if email:
        keys.append(identity_key(key=key, email=email))
    return keys


def contact_keys(contact: ContactDetails, *, key: bytes) -> list[str]:
    """Identity keys (keyed hashes) the contact cache knows, identifier first: the host's stable ID
    beats a phone number (a recipient's e-mail key is for suppressions only)."""
    return recipient_keys(key=key, identifier=contact.identifier, phone_number=contact.phone_number)


def keys_of_contact(contact: ContactDetails, *, key: bytes) -> list[str]:
    """Every key a notification's contact is known by."""
    return recipient_keys(key=key, identifier=contact.identifier, phone_number=contact.phone_number, email=contact.email)
