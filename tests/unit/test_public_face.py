"""dispatcher's public face: exactly these names, each one real, and a light import."""

from __future__ import annotations

import subprocess
import sys

import dispatcher


def test_all_is_exactly_the_public_face() -> None:
    assert dispatcher.__all__ == sorted([
        "AttemptRecord", "ConfigurationError", "Dispatcher", "DispatcherError", "EventConflict", "InvalidEvent",
        "NotificationRecord", "NotificationRequest", "Settings", "StateConflict", "UnknownNotification",
        "WebhookRejected", "load_settings", "notify", "status",
        "Recipient", "is_suppressed", "record_consent", "suppress", "unsuppress", "withdraw_consent",
        "cancel", "reschedule", "retry", "TooLate", "notify_many", "BatchItem",
    ])
    for name in dispatcher.__all__:
        assert getattr(dispatcher, name) is not None
    assert issubclass(dispatcher.EventConflict, dispatcher.InvalidEvent)
    assert issubclass(dispatcher.TooLate, dispatcher.StateConflict)
    assert callable(dispatcher.notify) and callable(dispatcher.status)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        dispatcher.nonexistent  # noqa: B018
    except AttributeError as error:
        assert "nonexistent" in str(error)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_package_loads_no_celery_or_sqlalchemy() -> None:
    code = "import sys, dispatcher; print(any(m.startswith(('celery', 'sqlalchemy')) for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_notify_and_status_from_the_environment(tmp_path, clean_environment) -> None:  # type: ignore[no-untyped-def]
    import dispatcher.service as service
    from tests.conftest import REPO_ROOT
    from tests.support.dispatcher_setup import reminder

    clean_environment.setenv("DISPATCHER_CONFIG", str(REPO_ROOT / "config" / "dispatcher.example.toml"))
    clean_environment.setenv("DISPATCHER_DATABASE_URL", f"sqlite:///{tmp_path}/face.sqlite")
    clean_environment.setenv("DISPATCHER_BROKER_URL", "memory://")
    clean_environment.setattr(service, "_default", None)
    record = dispatcher.notify(reminder("face-1", identifier="face-p", phone="+15550309111"))
    assert record.event_id == "face-1" and record.state == "queued"
    assert dispatcher.status("face-1") == record
    clean_environment.setattr(service, "_default", None)
