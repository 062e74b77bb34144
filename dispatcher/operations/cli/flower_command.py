"""``dispatcher flower``: Flower, the Celery monitor, against the configured broker.

It hands over to ``python -m celery -A workers.app flower`` with ``exec``. Task arguments are
notification and delivery IDs only (``argsrepr`` reads ``(notification=42)``), so Flower shows
no content, contact or token.

Credentials never go on the command line, where any local user can read them in the process
list: Flower reads ``FLOWER_BASIC_AUTH`` (``user:password``, comma-separated pairs) from the
environment itself, and this command only checks that it is there, never prints it.
"""

from __future__ import annotations

import ipaddress
import os
import sys

import click

from dispatcher.settings import load_settings

BASIC_AUTH_VARIABLE = "FLOWER_BASIC_AUTH"
OAUTH_VARIABLE = "FLOWER_AUTH"  # Flower's OAuth: a regular expression of e-mail addresses
_CREDENTIAL_OPTIONS = ("basic_auth", "oauth2_secret", "oauth2_key", "cookie_secret")
_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True}


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; an empty address means every interface."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def basic_auth_problem(value: str) -> str | None:
    """What is wrong with a FLOWER_BASIC_AUTH value, without repeating any part of it."""
    pairs = [pair for pair in value.split(",")]
    for number, pair in enumerate(pairs, start=1):
        user, colon, password = pair.partition(":")
        if not colon or not user.strip() or not password:
            return f"pair {number} is not user:password"
    return None


def flower_arguments(
    *, port: int, address: str, purge_offline_s: int, max_tasks: int, read_only: bool, extra: list[str]
) -> list[str]:
    """The argv handed to ``exec``. Flower's options (tornado) take the ``--name=value`` form only."""
    options = [
        f"--port={port}",
        f"--address={address}",
        "--persistent=False",  # keep task state in memory only: no state file on disk
        f"--max_tasks={max_tasks}",
        f"--read_only={read_only}",
    ]
    if purge_offline_s > 0:
        options.append(f"--purge_offline_workers={purge_offline_s}")
    return [sys.executable, "-m", "celery", "-A", "workers.app", "flower", *options, *extra]


def _credential_in(arguments: list[str]) -> str | None:
    for argument in arguments:
        name = argument.lstrip("-").partition("=")[0].replace("-", "_")
        if argument.startswith("-") and name in _CREDENTIAL_OPTIONS:
            return name
    return None


@click.command("flower", context_settings=_PASS_THROUGH)
@click.option("--port", default=5555, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--purge-offline-after",
    "purge_offline_s",
    default=600,
    show_default=True,
    type=click.IntRange(0, None),
    help="Forget workers offline this long, in seconds (restarted containers get new names); 0 keeps them.",
)
@click.option(
    "--max-tasks",
    default=10_000,
    show_default=True,
    type=click.IntRange(1, None),
    help="Tasks Flower keeps in memory; the oldest go first.",
)
@click.option(
    "--allow-control",
    is_flag=True,
    help="Allow Flower's write operations (run, revoke and rate-limit tasks, shut workers down). "
    "Without it Flower is read-only: nothing it does can send a notification.",
)
@click.option(
    "--allow-unauthenticated",
    is_flag=True,
    help=f"Listen on a non-loopback address without {BASIC_AUTH_VARIABLE} (only behind a proxy that authenticates).",
)
@click.pass_context
def flower_command(
    ctx: click.Context,
    port: int,
    address: str,
    purge_offline_s: int,
    max_tasks: int,
    allow_control: bool,
    allow_unauthenticated: bool,
) -> None:
    """Run Flower, the Celery monitor, against the configured broker.

    It shows workers, queues and the tasks dispatcher.send, dispatcher.outcome,
    dispatcher.sweep and dispatcher.tracking_sweep with their states and run times. Task
    arguments are IDs only, shown as (notification=42) or (delivery=7).

    Basic authentication comes from FLOWER_BASIC_AUTH=user:password in the environment (never
    from the command line). It is required on any address other than loopback. Flower's HTTP
    API (/api/...) answers only when authentication is on. Flower is read-only unless
    --allow-control is given. Further options go to Flower as they are, in its --name=value form.

    \b
    Examples:
      dispatcher flower
      FLOWER_BASIC_AUTH=ops:... dispatcher flower --address 0.0.0.0 --port 5555
      dispatcher flower --port 5556 --url_prefix=flower
    """
    credential = _credential_in(ctx.args)
    if credential is not None:
        raise click.UsageError(
            f"--{credential} would show a credential in the process list; set it in the environment "
            f"(FLOWER_{credential.upper()}) instead"
        )
    basic_auth = os.environ.get(BASIC_AUTH_VARIABLE, "")
    if basic_auth:
        problem = basic_auth_problem(basic_auth)
        if problem is not None:
            raise click.UsageError(f"{BASIC_AUTH_VARIABLE}: {problem} (comma-separated user:password pairs)")
    authenticated = bool(basic_auth) or bool(os.environ.get(OAUTH_VARIABLE))
    if not authenticated and not is_loopback(address) and not allow_unauthenticated:
        raise click.UsageError(
            f"--address {address or '(every interface)'} is reachable from other hosts: set "
            f"{BASIC_AUTH_VARIABLE}=user:password in the environment, or pass --allow-unauthenticated "
            "when a proxy in front authenticates"
        )
    load_settings()  # fail now, naming the key, rather than inside Flower with a traceback
    arguments = flower_arguments(
        port=port, address=address, purge_offline_s=purge_offline_s, max_tasks=max_tasks,
        read_only=not allow_control, extra=list(ctx.args),
    )
    os.execv(sys.executable, arguments)
