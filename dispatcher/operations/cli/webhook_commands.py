"""``dispatcher receiver`` (the webhook receiver process) and ``dispatcher webhooks register``.

The secret that createWebhook returns is printed once, to stdout, for the operator's secret
store; it is never logged and never written anywhere else.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import click
from uvicorn.config import LOGGING_CONFIG

from dispatcher.api import ApiError, Rejected, WorkspaceClient
from dispatcher.operations.cli import exits
from dispatcher.operations.cli.serving import TcpListenerConfig, serve
from dispatcher.settings import load_settings

APP_FACTORY = "dispatcher.tracking.webhooks.receiver:app_from_environment"
SUBSCRIPTIONS = ("message_created", "message_updated")


def receiver_log_config() -> dict[str, Any]:
    """uvicorn's logging, plus the dispatcher's loggers at WARNING (refusals, publish failures)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["dispatcher"] = {"handlers": ["default"], "level": "WARNING", "propagate": False}
    return config


@click.command("receiver")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="Server processes.")
def receiver_command(host: str, port: int, workers: int) -> None:
    """Run the webhook receiver: verify, record and queue signed deliveries.

    It answers POST on the configured webhook_path (default /webhooks/messaging), GET /healthz
    (the process runs), GET /readyz (the database would take a write, the broker answers) and GET /metrics.
    uvicorn's access log is off and its log level is warning; refusals are logged with their
    reason and delivery ID only. Put it behind TLS for a real workspace.

    \b
    Examples:
      DISPATCHER_WEBHOOK_SECRETS=... dispatcher receiver --host 127.0.0.1 --port 8080
      dispatcher receiver --port 8080 --workers 2
    """
    settings = load_settings()  # fail now, naming the key, rather than in every worker
    where = f"http://{host}:{port}"
    click.echo(f"receiver listening on {where}: webhooks at {settings.webhook_path}"
               + "".join(f", {settings.webhook_path}/{name}" for name in sorted(settings.workspaces))
               + ("; HTTP intake at /v1/notifications" if settings.intake_tokens() else "")
               + "; /healthz, /readyz, /metrics", err=True)
    # limit_concurrency: past it uvicorn answers 503 at once; timeout_keep_alive closes idle connections.
    config = TcpListenerConfig(APP_FACTORY, factory=True, host=host, port=port, workers=workers, access_log=False,
                               log_level="warning", log_config=receiver_log_config(), server_header=False,
                               limit_concurrency=settings.receiver_max_connections, timeout_keep_alive=5)
    try:
        started = serve(config)
    except OSError as error:
        click.echo(f"error: cannot listen on {where}: {error.strerror or type(error).__name__}", err=True)
        raise SystemExit(exits.USAGE) from None  # --host or --port: taken, or not this machine's
    if not started:
        raise SystemExit(exits.CONFIGURATION)  # the app did not load: uvicorn said why


@click.group("webhooks")
def webhooks_group() -> None:
    """Manage the workspace's webhook subscriptions.

    \b
    Example:
      dispatcher webhooks register --url https://hooks.example.org/webhooks/messaging
    """


@webhooks_group.command("register")
@click.option("--url", required=True, help="The receiver's public URL, including the webhook path.")
@click.option("--name", default=None, help="A name for the subscription in the workspace.")
@click.pass_context
def register_command(ctx: click.Context, url: str, name: str | None) -> None:
    """Subscribe URL to message_created and message_updated; print the signing secret ONCE.

    Store the secret in DISPATCHER_WEBHOOK_SECRETS (new first, comma-separated during a
    rotation) and restart the receiver. The workspace does not show it again.

    \b
    Example:
      dispatcher webhooks register --url https://hooks.example.org/webhooks/messaging --name dispatcher
    """
    settings = load_settings()
    transport = (ctx.obj or {}).get("transport")  # tests hand in an httpx transport
    with WorkspaceClient.from_settings(settings, transport=transport) as client:
        try:
            webhook = client.create_webhook(url=url, subscriptions=list(SUBSCRIPTIONS), name=name)
        except Rejected as refusal:
            reason = ("a webhook for this URL exists already, and a stock workspace keeps one per URL: keep using"
                      " the secret it was registered with" if _registered(client, url)
                      else "check the URL (an http or https URL the workspace accepts)")
            click.echo(f"error: the workspace refused the webhook (HTTP {refusal.status_code}): {reason}", err=True)
            raise SystemExit(exits.FAILED) from None
    click.echo(f"webhook {webhook.id} registered for {', '.join(SUBSCRIPTIONS)}")
    if webhook.secret is None or not webhook.secret.get_secret_value():
        click.echo("error: the workspace returned no signing secret", err=True)
        raise SystemExit(exits.FAILED)
    click.echo("signing secret (shown once; add it to DISPATCHER_WEBHOOK_SECRETS, new first):")
    click.echo(webhook.secret.get_secret_value())


@webhooks_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line.")
@click.pass_context
def list_webhooks_command(ctx: click.Context, as_json: bool) -> None:
    """List the workspace's webhook subscriptions: ID, URL and events (never a secret).

    \b
    Examples:
      dispatcher webhooks list
      dispatcher webhooks list --json
    """
    settings = load_settings()
    transport = (ctx.obj or {}).get("transport")  # tests hand in an httpx transport
    with WorkspaceClient.from_settings(settings, transport=transport) as client:
        hooks = client.list_webhooks()
    if as_json:
        for hook in hooks:
            click.echo(json.dumps({"id": hook.id, "url": hook.url, "subscriptions": list(hook.subscriptions)}))
        return
    if not hooks:
        click.echo("no webhook is registered", err=True)
        return
    click.echo(f"{'id':>6}  {'events':<34} url")
    for hook in hooks:
        click.echo(f"{hook.id:>6}  {', '.join(hook.subscriptions):<34} {hook.url or '-'}")


def _registered(client: WorkspaceClient, url: str) -> bool:
    """Whether the workspace lists a webhook for ``url``; False when the list cannot be read."""
    try:
        return any(hook.url == url for hook in client.list_webhooks())
    except ApiError:
        return False
