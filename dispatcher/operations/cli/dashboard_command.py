"""``dispatcher dashboard``: the operators' pages in the browser (docs/dashboard.md)."""

from __future__ import annotations

import click

from dispatcher.errors import ConfigurationError
from dispatcher.settings import load_settings
from dispatcher.store.db import require_existing_store

APP_FACTORY = "dispatcher.operations.dashboard.app:app_from_environment"


@click.command("dashboard")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8090, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
def dashboard_command(host: str, port: int) -> None:
    """Serve the operators' dashboard: counts, the notifications with filters, each one's timeline,
    what is set aside, and the cancel and retry actions. No message content or contact data.

    The browser asks for a password: DISPATCHER_OPERATOR_TOKEN (any user name). Put it behind TLS
    beyond this machine.

    \b
    Example:
      DISPATCHER_OPERATOR_TOKEN=... dispatcher dashboard --port 8090
    """
    import uvicorn

    settings = load_settings()  # fail now, naming the key
    if settings.operator_token is None:
        raise ConfigurationError("DISPATCHER_OPERATOR_TOKEN (operator_token)", "is required to serve the dashboard")
    require_existing_store(settings.database_url)
    click.echo(f"dashboard listening on http://{host}:{port}/ (password: the operator token)", err=True)
    uvicorn.run(APP_FACTORY, factory=True, host=host, port=port, access_log=False, log_level="warning",
                server_header=False)
