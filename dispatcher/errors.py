"""The dispatcher's error tree.

Branches are named for what the caller does next, not for the layer that failed::

    DispatcherError
      InvalidEvent            bad input at intake; names the field; never retried
      ConfigurationError      a setting is missing or wrong; names the key; fails start-up
      ApiError                (dispatcher.api.errors) a workspace API call went wrong
        NotSent               the request never left: safe to retry
        OutcomeUnknown        it may have taken effect: check before any resend
        ApiStatusError        the service answered with an error status
          RateLimited, ServerError, AccessDenied, NotFound, Rejected
        UnexpectedResponse    a body we cannot read
      WebhookRejected         a webhook delivery was refused; ``reason`` says why
      StateConflict           a compare-and-set lost the race
        TooLate               a cancel or reschedule came after the notification was sent or ended

Messages carry operation names, statuses, keys and our own IDs: never message content,
phone numbers, e-mail addresses, tokens or response bodies.
"""

from __future__ import annotations


class DispatcherError(Exception):
    """Root of every error the dispatcher raises on purpose."""


class InvalidEvent(DispatcherError):
    """A notification request was refused at intake; nothing was stored or sent."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


EXIT_CONFIGURATION = 3  # a process that stops on a ConfigurationError exits so (docs/operations.md)


class ConfigurationError(DispatcherError):
    """A setting is missing or invalid. ``key`` is the environment variable or TOML key."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}")


class WebhookRejected(DispatcherError):
    """A webhook delivery failed verification; ``reason`` is a short, body-free code."""

    def __init__(self, reason: str, *, status_code: int = 401) -> None:
        self.reason = reason
        self.status_code = status_code
        super().__init__(f"webhook rejected: {reason}")


class StateConflict(DispatcherError):
    """A compare-and-set found the row in another state than expected: someone else moved it."""


class EventConflict(InvalidEvent):
    """The event ID was handed over before with a different request; nothing new is stored."""

    def __init__(self, event_id: str) -> None:
        super().__init__("event_id", f"{event_id!r} was handed over before with a different request")


class EventSpent(EventConflict):
    """The event ID was handed over before, and its notification has since been purged by
    retention: it stays spent, so the event is not sent a second time."""

    def __init__(self, event_id: str) -> None:
        InvalidEvent.__init__(self, "event_id", f"{event_id!r} was handed over before; its record is past retention "
                                                "and it is not sent again")


class UnknownNotification(DispatcherError):
    """No notification is stored under that event ID."""

    def __init__(self, event_id: str) -> None:
        self.event_id = event_id
        super().__init__(f"no notification with event_id {event_id!r}")


class TooLate(StateConflict):
    """A host asked to cancel or reschedule a notification that is past the point where it can:
    a worker has it (its message may exist), or it has ended. ``state`` is where it is now."""

    def __init__(self, event_id: str, state: str, asked: str) -> None:
        self.event_id = event_id
        self._state = state  # read-only: an error reports the row's state, it never sets one
        super().__init__(f"too late to {asked} {event_id!r}: it is {state}")

    @property
    def state(self) -> str:
        return self._state
