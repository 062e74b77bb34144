"""notification-dispatcher: durable, idempotent business notifications through a messaging workspace.

The public face::

    import dispatcher

    record = dispatcher.notify({"event_id": "appt-42", "route": "reminders", ...})
    record = dispatcher.status("appt-42")
    record = dispatcher.cancel("appt-42")  # before it is sent; TooLate once a worker has it

Names load on first use, so ``import dispatcher`` stays light (no Celery or SQLAlchemy until a
name that needs them is touched).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatcher.errors import (
        ConfigurationError,
        DispatcherError,
        EventConflict,
        InvalidEvent,
        StateConflict,
        TooLate,
        UnknownNotification,
        WebhookRejected,
    )
    from dispatcher.intake.batch import BatchItem
    from dispatcher.intake.request import NotificationRequest
    from dispatcher.recipients.controls import Recipient
    from dispatcher.service import (
        Dispatcher,
        cancel,
        is_suppressed,
        notify,
        notify_many,
        record_consent,
        reschedule,
        retry,
        status,
        suppress,
        unsuppress,
        withdraw_consent,
    )
    from dispatcher.settings import Settings, load_settings
    from dispatcher.store.record import AttemptRecord, NotificationRecord

_WHERE = {
    "notify": "dispatcher.service",
    "notify_many": "dispatcher.service",
    "BatchItem": "dispatcher.intake.batch",
    "status": "dispatcher.service",
    "Dispatcher": "dispatcher.service",
    "cancel": "dispatcher.service",
    "reschedule": "dispatcher.service",
    "retry": "dispatcher.service",
    "suppress": "dispatcher.service",
    "unsuppress": "dispatcher.service",
    "is_suppressed": "dispatcher.service",
    "record_consent": "dispatcher.service",
    "withdraw_consent": "dispatcher.service",
    "Recipient": "dispatcher.recipients.controls",
    "NotificationRequest": "dispatcher.intake.request",
    "NotificationRecord": "dispatcher.store.record",
    "AttemptRecord": "dispatcher.store.record",
    "Settings": "dispatcher.settings",
    "load_settings": "dispatcher.settings",
    "DispatcherError": "dispatcher.errors",
    "InvalidEvent": "dispatcher.errors",
    "EventConflict": "dispatcher.errors",
    "UnknownNotification": "dispatcher.errors",
    "ConfigurationError": "dispatcher.errors",
    "WebhookRejected": "dispatcher.errors",
    "StateConflict": "dispatcher.errors",
    "TooLate": "dispatcher.errors",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'dispatcher' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
