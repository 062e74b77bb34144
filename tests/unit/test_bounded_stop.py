"""When a worker's stop is bounded (workers/bounded_stop.py): only after an error it could not
survive; a stop that a signal asked for waits for the tasks in flight, as Celery documents."""

from __future__ import annotations

from workers.bounded_stop import stop_bound_s

EX_OK, EX_FAILURE = 0, 1  # celery.platforms


def test_an_unrecoverable_error_bounds_the_stop_by_a_lease() -> None:
    assert stop_bound_s(EX_FAILURE, asked_for=False, stale_after_s=45.0) == 45.0


def test_a_stop_asked_for_is_not_bounded() -> None:
    assert stop_bound_s(EX_OK, asked_for=True, stale_after_s=45.0) is None  # SIGTERM: a warm shutdown
    assert stop_bound_s(EX_FAILURE, asked_for=True, stale_after_s=45.0) is None  # Ctrl-C stops with the failure code


def test_a_clean_exit_is_not_bounded() -> None:
    assert stop_bound_s(EX_OK, asked_for=False, stale_after_s=45.0) is None
    assert stop_bound_s(None, asked_for=False, stale_after_s=45.0) is None
