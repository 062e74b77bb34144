"""Contact identities at rest are keyed hashes: nothing that can be enumerated back to a number."""

from __future__ import annotations

import hashlib

from dispatcher.store.queries import identity_key


def test_identity_keys_are_keyed_and_stable() -> None:
    phone = "+15550199996"
    first = identity_key(key=b"key-one", phone_number=phone)
    assert first == identity_key(key=b"key-one", phone_number=phone)  # the same contact is found again
    assert first != identity_key(key=b"key-two", phone_number=phone)  # another key, another hash
    assert first != hashlib.sha256(f"phone\0{phone}".encode()).hexdigest()  # not the enumerable unkeyed hash
    assert identity_key(key=b"key-one", identifier=phone) != first  # an identifier and a phone never collide
    assert phone.lstrip("+") not in first
