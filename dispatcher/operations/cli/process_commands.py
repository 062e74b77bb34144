"""Commands that become a long-running process of another package.

They hand over with ``exec`` and name the other package by module path only: the sandbox is
the other side of the contract and shares no code with the dispatcher, so nothing here imports it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dispatcher.queues import MAINTENANCE_QUEUE, OUTCOMES_QUEUE, SEND_QUEUE

if TYPE_CHECKING:
    from dispatcher.settings import Settings


@click.command("sandbox")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=3000, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Sandbox seed and behaviour file (TOML); default: the seed shipped with the sandbox.",
)
@click.option(
    "--profile",
    type=click.Choice(["stock", "contract"]),
    default=None,
    help="stock (the default): behave like a stock workspace; contract: the contract's nominal shapes.",
)
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Keep the workspace's data in this file across restarts (default var/sandbox-state.jsonl).",
)
@click.option("--in-memory", is_flag=True, help="Keep nothing on disk: every start is empty.")
@click.option("--fresh", is_flag=True, help="Start empty: forget what the state file held.")
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="warning",
    show_default=True,
    help="Log level of the sandbox (operation names only, never values).",
)
def sandbox_command(
    host: str,
    port: int,
    config_path: Path | None,
    profile: str | None,
    state_path: Path | None,
    in_memory: bool,
    fresh: bool,
    log_level: str,
) -> None:
    """Run the sandbox: a local double of the messaging workspace.

    It serves the whole contract under /api/v1/accounts/{account_id}, delivers signed
    webhooks, injects faults on request, and shows what it holds under /_sandbox/. By
    default it behaves like a stock workspace and keeps its data in var/sandbox-state.jsonl,
    so a restart forgets nothing. At start it prints where it listens, the accounts, tokens
    and inboxes, and the command that registers a webhook.

    \b
    Examples:
      dispatcher sandbox --port 3000
      dispatcher sandbox --host 127.0.0.1 --port 3001 --config my-seed.toml --log-level info
      dispatcher sandbox --port 3002 --profile contract --in-memory
    """
    if in_memory and state_path is not None:
        raise click.UsageError("--state and --in-memory exclude each other")
    arguments = [sys.executable, "-m", "sandbox", "--host", host, "--port", str(port), "--log-level", log_level]
    if config_path is not None:
        arguments += ["--config", str(config_path)]
    if profile is not None:
        arguments += ["--profile", profile]
    if state_path is not None:
        arguments += ["--state", str(state_path)]
    if in_memory:
        arguments.append("--in-memory")
    if fresh:
        arguments.append("--fresh")
    os.execv(sys.executable, arguments)


_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True}


def _exec_celery(arguments: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, "-m", "celery", "-A", "workers.app", *arguments])


def _prepare_metrics() -> None:
    """With metrics on, prefork children must write them where the main process sums them: the
    folder has to be known before any process imports prometheus_client."""
    if _checked_settings().metrics_port is not None and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="dispatcher-metrics-")


def _checked_settings(*, sends: bool = True) -> Settings:
    """The settings, checked here, before Celery takes over the process: a bad key, or a limiter
    the workers would not share (``sends``: beat sends nothing), ends the command in one line
    (exit status 3), not in a traceback inside Celery."""
    from dispatcher import tracing
    from dispatcher.context import require_shared_limits
    from dispatcher.settings import load_settings

    settings = load_settings()
    if sends:
        require_shared_limits(settings)
    tracing.check_available(settings)
    return settings


@click.command("worker", context_settings=_PASS_THROUGH)
@click.option("--concurrency", "-c", type=click.IntRange(1, 256), default=2, show_default=True, help="Processes.")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.pass_context
def worker_command(ctx: click.Context, concurrency: int, loglevel: str) -> None:
    """Run send workers: the send and maintenance queues (Celery prefork).

    Further options go to `celery worker` as they are.

    \b
    Examples:
      dispatcher worker
      dispatcher worker --concurrency 4 --hostname send1@%h
    """
    _prepare_metrics()
    _exec_celery(
        ["worker", "--queues", f"{SEND_QUEUE},{MAINTENANCE_QUEUE}", "--concurrency", str(concurrency),
         "--loglevel", loglevel, *ctx.args]
    )


@click.command("consumer", context_settings=_PASS_THROUGH)
@click.option("--concurrency", "-c", type=click.IntRange(1, 256), default=2, show_default=True, help="Processes.")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.pass_context
def consumer_command(ctx: click.Context, concurrency: int, loglevel: str) -> None:
    """Run the outcome consumer: applies webhook deliveries and makes the fallback decisions.

    It serves the outcomes queue only, so a backlog of sends never delays outcomes. Further
    options go to `celery worker` as they are.

    \b
    Examples:
      dispatcher consumer
      dispatcher consumer --concurrency 4 --hostname outcomes1@%h
    """
    _prepare_metrics()
    _exec_celery(
        ["worker", "--queues", OUTCOMES_QUEUE, "--concurrency", str(concurrency), "--loglevel", loglevel, *ctx.args]
    )


@click.command("beat", context_settings=_PASS_THROUGH)
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.pass_context
def beat_command(ctx: click.Context, loglevel: str) -> None:
    """Run the periodic tasks (the sweep that relays the outbox and picks up due rows). Run one.

    \b
    Example:
      dispatcher beat --schedule var/beat-schedule
    """
    _checked_settings(sends=False)
    _exec_celery(["beat", "--loglevel", loglevel, *ctx.args])
