"""One SendContext per worker process, built on first use and rebuilt after a fork."""

from __future__ import annotations

import os

import httpx

from dispatcher.api import WorkspaceClient
from dispatcher.context import InboxDirectory, SendContext, make_breaker, make_limiter, retry_plan_of
from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.settings import Settings, load_settings
from dispatcher.store.db import session_factory, shared_engine

_context: SendContext | None = None
_enqueuer: CeleryEnqueuer | None = None
_callback_client: httpx.Client | None = None
_pid: int | None = None


def _fresh_process() -> bool:
    global _context, _enqueuer, _callback_client, _pid
    if _pid != os.getpid():
        _context, _enqueuer, _callback_client, _pid = None, None, None, os.getpid()
        return True
    return False


def settings() -> Settings:
    return send_context().settings


def send_context() -> SendContext:
    global _context
    _fresh_process()
    if _context is None:
        loaded = load_settings()
        api = WorkspaceClient.from_settings(loaded)
        _context = SendContext(
            settings=loaded,
            api=api,
            sessions=session_factory(shared_engine(loaded.database_url), announce=loaded.callbacks_on),
            limiter=make_limiter(loaded),
            inboxes=InboxDirectory(api.list_inboxes),
            plan=retry_plan_of(loaded),
            enqueuer=CeleryEnqueuer(loaded.broker_url),
            breaker=make_breaker(loaded),
        )
    return _context


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
        _enqueuer = CeleryEnqueuer(send_context().settings.broker_url)
    return _enqueuer
