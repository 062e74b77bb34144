"""The Python face for hosts: ``Dispatcher(settings).notify(request)`` and ``.status(event_id)``.

``dispatcher.notify(...)`` and ``dispatcher.status(...)`` use one default instance built from the
environment on first use.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from dispatcher import tracing
from dispatcher.enqueue import CeleryEnqueuer, Enqueuer
from dispatcher.intake import accept as intake
from dispatcher.intake import batch
from dispatcher.intake.batch import BatchItem
from dispatcher.intake.request import NotificationRequest, parse_request
from dispatcher.operations import cancel as host_cancel
from dispatcher.operations import retry as host_retry
from dispatcher.recipients.controls import Recipient, Recipients
from dispatcher.settings import Settings, load_settings
from dispatcher.store.db import require_existing_store, session_factory, shared_engine
from dispatcher.store.record import NotificationRecord


class Dispatcher:
    """Accepts notifications into the store and hands them to the send queue."""

    def __init__(self, settings: Settings, *, enqueuer: Enqueuer | None = None, migrate: bool = False) -> None:
        self.settings = settings
        if not tracing.enabled():  # the host's process starts each notification's trace (when on)
            tracing.configure(settings, service="dispatcher-intake")
        if migrate:
            from dispatcher.store.migrate import upgrade_database

            upgrade_database(settings.database_url)
        self.sessions: sessionmaker[Session] = session_factory(shared_engine(settings.database_url),
                                                               announce=settings.callbacks_on)
        self.enqueuer: Enqueuer = enqueuer or CeleryEnqueuer(settings.broker_url)
        # Opt-outs and consent (docs/opt-outs.md): suppress, unsuppress, is_suppressed,
        # record_consent, withdraw_consent, list, import_csv.
        self.recipients = Recipients(self.sessions, settings)

    def notify(self, request: NotificationRequest | dict[str, Any] | str | bytes) -> NotificationRecord:
        """Accept one business event; the same event again returns the stored notification.

        Raises InvalidEvent (naming the field) for a request that cannot be sent, and
        EventConflict when the event ID was handed over before with a different request.
        """
        parsed = parse_request(request)
        return intake.accept(parsed, sessions=self.sessions, settings=intake.workspace_settings(self.settings, parsed.workspace),
                             enqueuer=self.enqueuer)

    def notify_many(self, requests: Sequence[NotificationRequest | dict[str, Any] | str | bytes]) -> list[BatchItem]:
        """Hand over up to 1,000 business events at once: a result per item, in their order,
        ``accepted``, ``duplicate`` (handed over before with the same request) or ``refused`` (with
        the field at fault and the problem; nothing of it is stored). One bad item refuses only
        itself. Each item is idempotent by its event ID, as with :meth:`notify`."""
        return batch.accept_many(requests, sessions=self.sessions, settings=self.settings, enqueuer=self.enqueuer)

    def status(self, event_id: str, *, workspace: str | None = None) -> NotificationRecord:
        """The notification's record; UnknownNotification when there is none (in ``workspace``,
        when given: a host scoped to one workspace reaches nothing else)."""
        return intake.status(self.sessions, event_id, workspace)

    def cancel(self, event_id: str, *, workspace: str | None = None) -> NotificationRecord:
        """Cancel a notification not yet sent: once this returns, nothing of it is sent and nothing
        falls back (its record says ``cancelled``). TooLate, with its state, when a worker already
        holds it or it has ended; UnknownNotification when there is none. Safe to call again."""
        return host_cancel.cancel(self.sessions, event_id, workspace=workspace)

    def reschedule(self, event_id: str, send_at: datetime, *, workspace: str | None = None) -> NotificationRecord:
        """Move a scheduled notification to ``send_at`` (timezone-aware, in the future). TooLate
        when it is no longer scheduled; InvalidEvent naming ``send_at`` for a bad time."""
        return host_cancel.reschedule(self.sessions, self.settings, event_id, send_at, workspace=workspace)

    def retry(self, event_id: str, request: NotificationRequest | dict[str, Any] | str | bytes | None = None, *,
              workspace: str | None = None) -> NotificationRecord:
        """Run a notification again: one set aside as ``crash_loop`` (its send task kept dying)
        from where it was; a ``failed`` one as a new attempt on its route, the same event, with no
        second fallback. A failed notification's content was deleted when it failed, so hand the
        same ``request`` over with its retry. StateConflict when it is neither failed nor set
        aside (or the content is missing); EventConflict for a different request;
        UnknownNotification when there is none."""
        parsed = parse_request(request) if request is not None else None
        return host_retry.retry(self.sessions, self.settings, self.enqueuer, event_id, parsed, workspace=workspace)

    def recipients_for(self, workspace: str) -> Recipients:
        """The opt-out and consent controls of one workspace (its account's records); InvalidEvent
        naming ``workspace`` for a name the configuration does not have (an opt-out must never land
        in another account's records)."""
        chosen = intake.workspace_settings(self.settings, workspace)
        if chosen is self.settings:
            return self.recipients
        return Recipients(self.sessions, chosen)

    def suppress(self, recipient: Recipient | dict[str, Any], *, channel: str | None = None,
                 category: str | None = None) -> int:
        """Opt a recipient out: nothing more is sent to it in that scope (every channel and category
        unless narrowed), including notifications already scheduled or queued."""
        return self.recipients.suppress(recipient, channel=channel, category=category)

    def unsuppress(self, recipient: Recipient | dict[str, Any], *, channel: str | None = None,
                   category: str | None = None) -> int:
        return self.recipients.unsuppress(recipient, channel=channel, category=category)

    def is_suppressed(self, recipient: Recipient | dict[str, Any], *, channel: str, category: str = "service") -> bool:
        return self.recipients.is_suppressed(recipient, channel=channel, category=category)

    def record_consent(self, recipient: Recipient | dict[str, Any], *, reference: str,
                       channel: str = "web_session") -> int:
        return self.recipients.record_consent(recipient, reference=reference, channel=channel)

    def withdraw_consent(self, recipient: Recipient | dict[str, Any], *, channel: str = "web_session") -> int:
        return self.recipients.withdraw_consent(recipient, channel=channel)


_default: Dispatcher | None = None
_default_lock = threading.Lock()


def default_dispatcher(*, stored: bool = False) -> Dispatcher:
    """The process's dispatcher, from the environment's settings, made on first use. ``stored``:
    the caller reads what is stored, so an embedded store whose file is missing is a wrong path
    (ConfigurationError), not a new, empty store made there."""
    global _default
    with _default_lock:
        if _default is None:
            settings = load_settings()
            if stored:
                require_existing_store(settings.database_url)
            _default = Dispatcher(settings, migrate=settings.database_url.startswith("sqlite"))
        return _default


def notify(request: NotificationRequest | dict[str, Any] | str | bytes) -> NotificationRecord:
    """Hand over one business event (see :meth:`Dispatcher.notify`)."""
    return default_dispatcher().notify(request)


def notify_many(requests: Sequence[NotificationRequest | dict[str, Any] | str | bytes]) -> list[BatchItem]:
    """Hand over many business events at once (see :meth:`Dispatcher.notify_many`)."""
    return default_dispatcher().notify_many(requests)


def status(event_id: str) -> NotificationRecord:
    return default_dispatcher().status(event_id)


def cancel(event_id: str) -> NotificationRecord:
    """Cancel a notification not yet sent (see :meth:`Dispatcher.cancel`)."""
    return default_dispatcher().cancel(event_id)


def reschedule(event_id: str, send_at: datetime) -> NotificationRecord:
    """Move a scheduled notification to another time (see :meth:`Dispatcher.reschedule`)."""
    return default_dispatcher().reschedule(event_id, send_at)


def retry(event_id: str, request: NotificationRequest | dict[str, Any] | str | bytes | None = None) -> NotificationRecord:
    """Run a failed or set-aside notification again (see :meth:`Dispatcher.retry`)."""
    return default_dispatcher().retry(event_id, request)


def suppress(recipient: Recipient | dict[str, Any], *, channel: str | None = None, category: str | None = None) -> int:
    """Opt a recipient out (see :meth:`Dispatcher.suppress`)."""
    return default_dispatcher().suppress(recipient, channel=channel, category=category)


def unsuppress(recipient: Recipient | dict[str, Any], *, channel: str | None = None, category: str | None = None) -> int:
    return default_dispatcher().unsuppress(recipient, channel=channel, category=category)


def is_suppressed(recipient: Recipient | dict[str, Any], *, channel: str, category: str = "service") -> bool:
    return default_dispatcher().is_suppressed(recipient, channel=channel, category=category)


def record_consent(recipient: Recipient | dict[str, Any], *, reference: str, channel: str = "web_session") -> int:
    return default_dispatcher().record_consent(recipient, reference=reference, channel=channel)


def withdraw_consent(recipient: Recipient | dict[str, Any], *, channel: str = "web_session") -> int:
    return default_dispatcher().withdraw_consent(recipient, channel=channel)
