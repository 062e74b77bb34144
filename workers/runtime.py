"""One SendContext per worker process, built on first use and rebuilt after a fork."""

from __future__ import annotations

import os

import httpx

from dispatcher.api import WorkspaceClient
from dispatcher.context import InboxDirectory, SendContext, make_breaker, make_limiter, retry_plan_of
from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.settings import DEFAULT_WORKSPACE, Settings, load_settings
from dispatcher.store import queries as store
from dispatcher.store.db import session_factory, shared_engine

_context: SendContext | None = None
_enqueuer: CeleryEnqueuer | None = None
_callback_client: httpx.Client | None = None
_workspaces: dict[str, SendContext] = {}
_pid: int | None = None


def _fresh_process() -> bool:
    global _context, _enqueuer, _callback_client, _pid
    if _pid != os.getpid():
        _context, _enqueuer, _callback_client, _pid = None, None, None, os.getpid()
        _workspaces.clear()
        return True
    return False


def settings() -> Settings:
    return send_context().settings


def send_context(workspace: str = DEFAULT_WORKSPACE) -> SendContext:
    """The context of one workspace (docs/workspaces.md): its API client, shared limiter and
    breaker, inbox cache; built on first use in this process."""
    global _context
    _fresh_process()
    if _context is None:
        _context = _build(load_settings())
    if workspace == DEFAULT_WORKSPACE or workspace not in _context.settings.workspaces:
        return _context
    built = _workspaces.get(workspace)
    if built is None:
        built = _workspaces[workspace] = _build(_context.settings.for_workspace(workspace))
    return built


def serves(workspace: str) -> bool:
    return workspace == DEFAULT_WORKSPACE or workspace in send_context().settings.workspaces


def contexts() -> list[SendContext]:
    """Every workspace's context, the default one first (the sweeps run each one's tracking)."""
    default = send_context()
    return [default, *(send_context(name) for name in sorted(default.settings.workspaces))]


def workspace_of(table: str, row_id: int) -> str:
    """The workspace of a notification or a webhook delivery, read only when there are several."""
    context = send_context()
    if not context.settings.workspaces:
        return DEFAULT_WORKSPACE
    with context.sessions() as session:
        found = store.workspace_of_row(session, table, row_id)
    return found if found is not None else DEFAULT_WORKSPACE


def _build(loaded: Settings) -> SendContext:
    api = WorkspaceClient.from_settings(loaded)
    return SendContext(
        settings=loaded,
        api=api,
        sessions=session_factory(shared_engine(loaded.database_url), announce=loaded.callbacks_on),
        limiter=make_limiter(loaded),
        inboxes=InboxDirectory(api.list_inboxes),
        plan=retry_plan_of(loaded),
        enqueuer=CeleryEnqueuer(loaded.broker_url),
        breaker=make_breaker(loaded),
    )


def callback_client() -> httpx.Client:
    """The process's HTTP client for the host's callback URLs (not the workspace's: another host)."""
    global _callback_client
    _fresh_process()
    if _callback_client is None:
        _callback_client = httpx.Client(follow_redirects=False)
    return _callback_client


def enqueuer() -> CeleryEnqueuer:
    global _enqueuer
    _fresh_process()
    if _enqueuer is None:
        loaded = send_context().settings  # the top level's: it names every workspace's send queues
        _enqueuer = CeleryEnqueuer(loaded.broker_url, queues=loaded.send_queues)
    return _enqueuer
