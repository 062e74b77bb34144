"""Exact contact lookup over the substring search: identifier first, then E.164 phone."""

from __future__ import annotations

import httpx
import pytest

from dispatcher.api import find_contact_exact

PHONE = "+15551234"


def search_service(pages_by_query: dict[str, list[list[dict]]], *, has_more: bool | None = None):
    """A fake searchContacts: ``pages_by_query[q][page-1]``, an empty page past the end."""
    seen: list[tuple[str, int]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        q, page = request.url.params["q"], int(request.url.params["page"])
        seen.append((q, page))
        pages = pages_by_query.get(q, [])
        contacts = pages[page - 1] if page <= len(pages) else []
        meta = {"count": len(contacts), "current_page": str(page)}
        if has_more is not None:
            meta["has_more"] = has_more and page < len(pages)
        return httpx.Response(200, json={"meta": meta, "payload": contacts})

    return answer, seen


def test_identifier_match_wins_and_stops_searching(make_client) -> None:
    answer, seen = search_service({
        "p-7": [[{"id": 1, "identifier": "p-70"}, {"id": 2, "identifier": "p-7"}]],
        PHONE: [[{"id": 3, "phone_number": PHONE}]],
    })
    client, _ = make_client(answer)
    found = find_contact_exact(client, identifier="p-7", phone_number=PHONE)
    assert found is not None and found.id == 2
    assert seen == [("p-7", 1)]  # the phone search never ran


def test_falls_back_to_exact_phone_and_rejects_substring_neighbours(make_client) -> None:
    answer, seen = search_service({
        "p-7": [[{"id": 1, "identifier": "p-70"}, {"id": 4, "identifier": "xp-7"}]],
        PHONE: [[{"id": 5, "phone_number": "+155512345"}, {"id": 6, "phone_number": "+155512"}],
                [{"id": 7, "phone_number": PHONE}]],
    }, has_more=True)
    client, _ = make_client(answer)
    found = find_contact_exact(client, identifier="p-7", phone_number=PHONE)
    assert found is not None and found.id == 7
    assert seen == [("p-7", 1), (PHONE, 1), (PHONE, 2)]


def test_short_number_does_not_match_a_longer_one(make_client) -> None:
    answer, _ = search_service({"+1555123": [[{"id": 8, "phone_number": "+15551234"}]]})
    client, _ = make_client(answer)
    assert find_contact_exact(client, phone_number="+1555123") is None


def test_absent_returns_none(make_client) -> None:
    answer, seen = search_service({})
    client, _ = make_client(answer)
    assert find_contact_exact(client, identifier="nobody", phone_number=PHONE) is None
    assert seen == [("nobody", 1), (PHONE, 1)]


def test_paging_is_bounded(make_client) -> None:
    # a service that always claims there is more, with only neighbours
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"meta": {"has_more": True}, "payload": [{"id": 9, "phone_number": PHONE + "9"}]})

    client, recorder = make_client(answer)
    assert find_contact_exact(client, phone_number=PHONE, max_pages=3) is None
    assert len(recorder.requests) == 3


@pytest.mark.parametrize("kwargs", [{}, {"identifier": ""}, {"phone_number": "15551234"},
                                    {"phone_number": "+0123"}, {"phone_number": "+1 555 1234"}])
def test_bad_arguments_are_refused_before_any_request(make_client, kwargs: dict) -> None:
    client, recorder = make_client(lambda r: httpx.Response(200, json={"payload": []}))
    with pytest.raises(ValueError) as info:
        find_contact_exact(client, **kwargs)
    assert "555" not in str(info.value)
    assert recorder.requests == []
