"""A transactional outbox for hosts that use SQLAlchemy on the dispatcher's database.

``outbox.add(session, request)`` stages the notification inside the host's own transaction: it
exists exactly when the host's commit succeeds. Nothing is published then; the relay (the beat
sweep, :func:`dispatcher.operations.sweep.sweep`) publishes committed rows that were never enqueued, so a
host crash between its commit and an enqueue loses nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from dispatcher.intake.accept import stage, workspace_settings
from dispatcher.intake.request import NotificationRequest, parse_request
from dispatcher.settings import Settings, load_settings
from dispatcher.store.models import utcnow


def add(session: Session, request: NotificationRequest | dict[str, Any], *, settings: Settings | None = None) -> int:
    """Stage the notification in the host's transaction; return its id. Validates like notify()."""
    parsed = parse_request(request)
    notification, _new = stage(session, parsed, workspace_settings(settings or load_settings(), parsed.workspace),
                               now=utcnow())
    return notification.id
