"""``dispatcher config check`` and ``dispatcher inboxes``: is the configuration right?"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click

from dispatcher import tracing
from dispatcher.api import WorkspaceClient
from dispatcher.operations.cli import exits
from dispatcher.policy.routes import find_route_inbox
from dispatcher.settings import Settings, load_settings


@click.group("config")
def config_group() -> None:
    """Check the configuration."""


@config_group.command("check")
@click.option("--json", "as_json", is_flag=True, help="The summary as one JSON object.")
def config_check_command(as_json: bool) -> None:
    """Load the settings, report the first bad key, and summarise them without secrets.

    \b
    Examples:
      DISPATCHER_CONFIG=config/dispatcher.example.toml dispatcher config check
      DISPATCHER_CONFIG=config/dispatcher.example.toml dispatcher config check --json
      DISPATCHER_ACCOUNT_ID=abc dispatcher config check    # fails, naming the key (exit status 3)
    """
    settings = load_settings()
    tracing.check_available(settings)  # tracing asked for, its packages missing: a configuration mistake
    if as_json:
        click.echo(json.dumps(_summary(settings)))
        return
    click.echo(f"api_url: {without_password(str(settings.api_url))}")
    click.echo(f"database_url: {without_password(settings.database_url)}")
    click.echo(f"broker_url: {without_password(settings.broker_url)}")
    click.echo(f"account_id: {settings.account_id}")
    click.echo("api_token: set (hidden)")
    click.echo(f"webhook secrets: {len(settings.webhook_secrets)}")
    click.echo(f"webhook header prefix: {settings.webhook_header_prefix}")
    click.echo(f"routes: {len(settings.routes)}")
    for name, route in sorted(settings.routes.items()):
        inbox = f"inbox {route.inbox_id}" if route.inbox_id is not None else f"inbox named {route.inbox_name!r}"
        fallback = f", falls back to {route.fallback}" if route.fallback else ""
        click.echo(f"  {name}: {route.channel.value} through {inbox}{fallback}")
    click.echo(f"templates: {len(settings.templates)}")
    for template in settings.templates:
        click.echo(
            f"  {template.name} ({template.language}, {template.category}, {template.body_params} body parameters)"
        )
    if settings.workspaces:
        click.echo(f"workspaces: {', '.join(settings.workspace_names)}")
    click.echo("configuration OK")


def _summary(settings: Settings) -> dict[str, Any]:
    """What ``config check`` prints, as data: URLs without passwords, counts of secrets, never one."""
    return {
        "api_url": without_password(settings.api_url), "database_url": without_password(settings.database_url),
        "broker_url": without_password(settings.broker_url), "account_id": settings.account_id,
        "webhook_secrets": len(settings.webhook_secrets), "webhook_header_prefix": settings.webhook_header_prefix,
        "routes": {name: {"channel": route.channel.value, "inbox_id": route.inbox_id, "inbox_name": route.inbox_name,
                          "fallback": route.fallback, "send_window": route.send_window}
                   for name, route in sorted(settings.routes.items())},
        "templates": [{"name": template.name, "language": template.language, "category": template.category,
                       "body_params": template.body_params} for template in settings.templates],
        "workspaces": {name: {"api_url": without_password(settings.for_workspace(name).api_url),
                              "account_id": settings.for_workspace(name).account_id}
                       for name in settings.workspace_names},
        "ok": True,
    }


@click.command("inboxes")
@click.option("--json", "as_json", is_flag=True, help="The inboxes and each route's inbox as one JSON object.")
@click.pass_context
def inboxes_command(ctx: click.Context, as_json: bool) -> None:
    """List the workspace's inboxes and the inbox each configured route resolves to.

    Exit status 1 when a route matches no inbox.

    \b
    Examples:
      DISPATCHER_CONFIG=config/dispatcher.example.toml dispatcher inboxes
      DISPATCHER_CONFIG=config/dispatcher.example.toml dispatcher inboxes --json
    """
    settings = load_settings()
    transport = (ctx.obj or {}).get("transport")  # tests hand in an httpx transport
    with WorkspaceClient.from_settings(settings, transport=transport) as client:
        inboxes = client.list_inboxes()
    resolved = {name: find_route_inbox(route, inboxes) for name, route in sorted(settings.routes.items())}
    if as_json:
        click.echo(json.dumps({
            "inboxes": [{"id": inbox.id, "name": inbox.name, "channel_type": inbox.channel_type} for inbox in inboxes],
            "routes": {name: found.id if found is not None else None for name, found in resolved.items()}}))
    else:
        click.echo(f"{'inbox':>6}  {'channel type':<24} name")
        for inbox in inboxes:
            click.echo(f"{inbox.id:>6}  {inbox.channel_type or '-':<24} {inbox.name}")
        for name, found in resolved.items():
            if found is None:
                click.echo(f"route {name}: NO MATCHING INBOX", err=True)
            else:
                click.echo(f"route {name}: inbox {found.id} ({found.name})")
    if any(found is None for found in resolved.values()):
        raise SystemExit(exits.FAILED)


def without_password(url: str) -> str:
    """``url`` with any password in it replaced by ``***`` (a URL may carry one: never print it)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
