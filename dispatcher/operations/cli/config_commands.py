"""``dispatcher config check`` and ``dispatcher inboxes``: is the configuration right?"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import click

from dispatcher.api import WorkspaceClient
from dispatcher.policy.routes import find_route_inbox
from dispatcher.settings import load_settings


@click.group("config")
def config_group() -> None:
    """Check the configuration."""


@config_group.command("check")
def config_check_command() -> None:
    """Load the settings, report the first bad key, and summarise them without secrets.

    \b
    Examples:
      DISPATCHER_CONFIG=config/dispatcher.example.toml dispatcher config check
      DISPATCHER_ACCOUNT_ID=abc dispatcher config check    # fails, naming the key
    """
    settings = load_settings()
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
    click.echo("configuration OK")


@click.command("inboxes")
def inboxes_command() -> None:
    """List the workspace's inboxes and the inbox each configured route resolves to.

    \b
    Example:
      DISPATCHER_CONFIG=config/dispatcher.example.toml dispatcher inboxes
    """
    settings = load_settings()
    with WorkspaceClient.from_settings(settings) as client:
        inboxes = client.list_inboxes()
    for inbox in inboxes:
        click.echo(f"{inbox.id:>6}  {inbox.channel_type or '-':<24} {inbox.name}")
    unresolved = 0
    for name, route in sorted(settings.routes.items()):
        found = find_route_inbox(route, inboxes)
        if found is None:
            unresolved += 1
            click.echo(f"route {name}: NO MATCHING INBOX", err=True)
        else:
            click.echo(f"route {name}: inbox {found.id} ({found.name})")
    if unresolved:
        raise SystemExit(1)


def without_password(url: str) -> str:
    """``url`` with any password in it replaced by ``***`` (a URL may carry one: never print it)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
