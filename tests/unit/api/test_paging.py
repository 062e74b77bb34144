"""Paging helpers stop on their own and never loop past their bound."""

from __future__ import annotations

import logging

import httpx
import pytest

from dispatcher.api import iter_conversations, iter_messages, iter_search_results


def test_search_stops_when_has_more_is_false(make_client) -> None:
    pages = {1: ([{"id": 1}, {"id": 2}], True), 2: ([{"id": 3}], False)}

    def answer(request: httpx.Request) -> httpx.Response:
        contacts, more = pages[int(request.url.params["page"])]
        return httpx.Response(200, json={"meta": {"has_more": more}, "payload": contacts})

    client, recorder = make_client(answer)
    assert [c.id for c in iter_search_results(client, "ann")] == [1, 2, 3]
    assert len(recorder.requests) == 2


def test_search_without_has_more_stops_at_an_empty_page(make_client) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        page = int(request.url.params["page"])
        return httpx.Response(200, json={"payload": [{"id": page}] if page < 3 else []})

    client, recorder = make_client(answer)
    assert [c.id for c in iter_search_results(client, "ann")] == [1, 2]
    assert len(recorder.requests) == 3


def test_search_cap_logs_a_warning_without_the_query(make_client, caplog: pytest.LogCaptureFixture) -> None:
    client, recorder = make_client(lambda r: httpx.Response(200, json={"meta": {"has_more": True}, "payload": [{"id": 1}]}))
    with caplog.at_level(logging.WARNING, logger="dispatcher.api.paging"):
        assert len(list(iter_search_results(client, "+15551234", max_pages=4))) == 4
    assert len(recorder.requests) == 4
    assert "max_pages=4" in caplog.text and "1555" not in caplog.text


def test_conversations_page_until_empty_and_bounded(make_client) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        page = int(request.url.params["page"])
        payload = [{"id": page * 10}] if page <= 2 else []
        return httpx.Response(200, json={"data": {"meta": {}, "payload": payload}})

    client, recorder = make_client(answer)
    assert [c.id for c in iter_conversations(client, inbox_id=3, status="all")] == [10, 20]
    assert recorder.requests[0].url.params["inbox_id"] == "3"
    endless, endless_recorder = make_client(lambda r: httpx.Response(200, json={"payload": [{"id": 1}]}))
    assert len(list(iter_conversations(endless, max_pages=5))) == 5
    assert len(endless_recorder.requests) == 5


def test_messages_page_back_with_before_newest_first(make_client) -> None:
    history = list(range(1, 46))  # message ids 1..45, the service returns 20 ascending

    def answer(request: httpx.Request) -> httpx.Response:
        before = int(request.url.params.get("before", 10**9))
        older = [i for i in history if i < before][-20:]
        return httpx.Response(200, json={"meta": {}, "payload": [{"id": i} for i in older]})

    client, recorder = make_client(answer)
    ids = [m.id for m in iter_messages(client, 42)]
    assert ids == list(range(45, 0, -1))
    assert [r.url.params.get("before") for r in recorder.requests] == [None, "26", "6", "1"]


def test_messages_stop_when_the_service_ignores_before(make_client) -> None:
    client, recorder = make_client(lambda r: httpx.Response(200, json={"payload": [{"id": 5}, {"id": 6}]}))
    assert [m.id for m in iter_messages(client, 42)] == [6, 5]
    assert len(recorder.requests) == 2


def test_messages_bounded(make_client) -> None:
    counter = iter(range(10**6, 0, -1))

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"payload": [{"id": next(counter)}]})

    client, recorder = make_client(answer)
    assert len(list(iter_messages(client, 42, max_pages=3))) == 3
    assert len(recorder.requests) == 3


@pytest.mark.parametrize("max_pages", [0, -1, True])
def test_max_pages_must_be_positive(make_client, max_pages: int) -> None:
    client, _ = make_client(lambda r: httpx.Response(200, json={"payload": []}))
    with pytest.raises(ValueError, match="max_pages"):
        list(iter_search_results(client, "x", max_pages=max_pages))
