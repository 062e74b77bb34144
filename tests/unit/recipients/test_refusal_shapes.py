"""The opt-out refusal a claim carries is built once per shape (docs/benchmarks.md, the send path):
the claim's statements are cached by the refusal clause's identity, so each call must hand the
same clause for the same shape, with only its parameters new."""

from __future__ import annotations

from dispatcher.store.account import Account
from dispatcher.store.db import BoundCondition
from dispatcher.store.suppressions import refusal_clause

ACCOUNT = Account("default", 1)


def _refusal(keys: list[str], *, needs_consent: bool, channel: str = "sms") -> BoundCondition:
    return refusal_clause(account=ACCOUNT, keys=keys, channel=channel, category="reminder", needs_consent=needs_consent)


def test_each_shape_of_refusal_is_one_clause_whatever_the_recipient() -> None:
    for needs_consent in (False, True):
        first = _refusal(["key-a"], needs_consent=needs_consent)
        second = _refusal(["key-b", "key-c"], needs_consent=needs_consent, channel="whatsapp")
        assert first.clause is second.clause
        assert first.params["refuse_keys"] == ["key-a"] and second.params["refuse_keys"] == ["key-b", "key-c"]
        assert second.params["refuse_channel"] == "whatsapp"
        assert _refusal([], needs_consent=needs_consent).clause is _refusal([], needs_consent=needs_consent).clause
    assert _refusal(["key-a"], needs_consent=False).clause is not _refusal(["key-a"], needs_consent=True).clause
