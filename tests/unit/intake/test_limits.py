"""The intake's limits match what the store and the workspace keep: a request that passes intake
never fails later on a column that is too short (an e-mail address of 265 characters used to)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.intake.request import ContactDetails, NotificationRequest
from dispatcher.recipients.contact import EMAIL_MAX_CHARS
from dispatcher.store.models import Notification

WORKSPACE_TEXT_COLUMN = 255  # the stock workspace keeps contact name, e-mail and identifier in varchar(255)


def _max_length(model: type[Any], field: str) -> int:
    """The maxLength the request's own schema gives ``field`` (its string branch, when optional)."""
    schema = model.model_json_schema()["properties"][field]
    for branch in [schema, *schema.get("anyOf", [])]:
        if "maxLength" in branch:
            return int(branch["maxLength"])
    raise AssertionError(f"{model.__name__}.{field} has no maximum length")


@pytest.mark.parametrize(("field", "column"), [
    ("event_id", Notification.__table__.c.event_id),
    ("route", Notification.__table__.c.route),
    ("fallback_route", Notification.__table__.c.fallback_route),
])
def test_each_stored_field_fits_its_column(field: str, column: Any) -> None:
    assert _max_length(NotificationRequest, field) == column.type.length


@pytest.mark.parametrize("field", ["identifier", "name", "email"])
def test_each_contact_field_fits_the_workspace(field: str) -> None:
    assert _max_length(ContactDetails, field) <= WORKSPACE_TEXT_COLUMN
    assert EMAIL_MAX_CHARS == 254  # RFC 5321's longest address
