"""The command line's exit statuses, by kind of outcome (docs/operations.md lists them), and the
one line each error ends a command with: what is wrong and what to do, never a traceback, never a
value from the request (a phone number, a content), a secret or a statement's text."""

from __future__ import annotations

from sqlalchemy.exc import SQLAlchemyError

from dispatcher.api import AccessDenied, ApiError, NotFound, Rejected
from dispatcher.errors import EXIT_CONFIGURATION, ConfigurationError, DispatcherError, StateConflict, UnknownNotification

OK = 0
FAILED = 1  # the thing asked about failed, came too late, or was not found
USAGE = 2  # a mistake in the command or in the request it hands over
CONFIGURATION = EXIT_CONFIGURATION  # a setting is missing or wrong (the workspace refusing the token is one)
UNREACHABLE = 4  # the database, the broker or the workspace did not answer

STATUSES = f"""\b
Exit statuses:
  {OK}  done
  {FAILED}  what was asked about failed, came too late, or was not found
  {USAGE}  a mistake in the command or the request
  {CONFIGURATION}  a setting is missing or wrong
  {UNREACHABLE}  the database, the broker or the workspace did not answer"""


def _broker_errors() -> tuple[type[BaseException], ...]:
    from kombu.exceptions import OperationalError as BrokerUnreachable
    from redis.exceptions import ConnectionError as RedisUnreachable
    from redis.exceptions import TimeoutError as RedisTimeout

    return BrokerUnreachable, RedisUnreachable, RedisTimeout


def status_and_line(error: BaseException) -> tuple[int, str] | None:
    """The exit status and the one line for an error an operator can cause; None: a bug (let it show)."""
    if isinstance(error, (UnknownNotification, StateConflict)):
        return FAILED, f"error: {error}"
    if isinstance(error, ConfigurationError):
        return CONFIGURATION, f"error: {error}"
    if isinstance(error, AccessDenied):
        return CONFIGURATION, (f"error: the workspace refused the API token ({error}); check DISPATCHER_API_TOKEN "
                               "(api_token) and DISPATCHER_ACCOUNT_ID (account_id)")
    if isinstance(error, NotFound):
        return CONFIGURATION, (f"error: the workspace has no such account or path ({error}); check DISPATCHER_API_URL "
                               "(api_url) and DISPATCHER_ACCOUNT_ID (account_id)")
    if isinstance(error, Rejected):
        return FAILED, f"error: the workspace refused the request ({error})"
    if isinstance(error, ApiError):
        return UNREACHABLE, f"error: the workspace API failed the command ({error}); run it again once it answers"
    if isinstance(error, DispatcherError):
        return USAGE, f"error: {error}"
    if isinstance(error, SQLAlchemyError):
        # The error's class only: a driver's message may quote the statement's text.
        return UNREACHABLE, (f"error: the database failed the command ({type(error).__name__}); check that it answers "
                             "and its schema is current (dispatcher db upgrade), then run it again (the same event "
                             "is never stored twice)")
    if isinstance(error, _broker_errors()):
        return UNREACHABLE, (f"error: the broker did not answer ({type(error).__name__}); check DISPATCHER_BROKER_URL "
                             "(broker_url) and run it again once it answers (the same event is never sent twice)")
    return None
