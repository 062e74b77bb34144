"""Opt-out and opt-in replies: a customer's whole message, trimmed and in any case, against a
route's keyword lists. "Please don't stop the reminders" is not an opt-out: only the whole text counts.

The receiver calls :func:`keyword_of` with every route's words, so the one word (never the text)
is all a stored webhook summary keeps; the consumer then reads it with the lists of the route the
reply came in on (:func:`reply_intent`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from dispatcher.settings import Route

Intent = Literal["opt_out", "opt_in"]
MAX_KEYWORD_CHARS = 20


def normalise(text: str) -> str:
    return " ".join(text.split()).upper()


def vocabulary(routes: Iterable[Route]) -> frozenset[str]:
    """Every keyword of every route: what a reply must be, whole, to be kept as a keyword."""
    return frozenset(word for route in routes for word in (*route.opt_out_keywords, *route.opt_in_keywords))


def keyword_of(text: object, words: frozenset[str]) -> str | None:
    """The keyword a reply is, or None (any other text, which is then forgotten)."""
    if not isinstance(text, str) or len(text) > 200:
        return None
    word = normalise(text)
    return word if word in words else None


def reply_intent(keyword: str | None, route: Route) -> Intent | None:
    if keyword is None:
        return None
    if keyword in route.opt_out_keywords:
        return "opt_out"
    if keyword in route.opt_in_keywords:
        return "opt_in"
    return None
