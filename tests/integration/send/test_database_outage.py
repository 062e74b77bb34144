"""A database outage costs no notification and no long wait: real workers lose their database
(a TCP proxy in front of PostgreSQL cuts the link) while notifications arrive, and every one is
sent once within seconds of the database answering again, not at the sweep's five minutes.

The sweep runs at its defaults here (every 5 s, rows queued again after 300 s without news): the
integration tests' 6 s would hide a task that gave up, since the sweep would soon queue it again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from dispatcher.enqueue import CeleryEnqueuer
from dispatcher.service import Dispatcher
from dispatcher.store.migrate import upgrade_database
from tests.support.dispatcher_setup import example_settings, reminder
from tests.support.sandbox_process import SandboxProcess, running_sandbox
from tests.support.tcp_proxy import TcpProxy, tcp_proxy
from tests.support.worker_process import ProcessGroup, dispatcher_environment, fresh_broker_url, process_group, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ACCEPTED = {"accepted", "sent", "delivered", "read"}
OUTAGE_S = 6.0  # how long the link stays cut: longer than the first few retries


@pytest.fixture()
def stack(fresh_postgres_url: str, redis_url: str, tmp_path: Path, clean_environment: pytest.MonkeyPatch
          ) -> Iterator[tuple[Dispatcher, ProcessGroup, TcpProxy, SandboxProcess]]:
    upgrade_database(fresh_postgres_url)
    direct = sa.engine.make_url(fresh_postgres_url)
    with running_sandbox() as sandbox, tcp_proxy(direct.host or "127.0.0.1", direct.port or 5432) as proxy:
        through_proxy = direct.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        broker_url = fresh_broker_url(redis_url)
        env = dispatcher_environment(api_url=sandbox.base_url, database_url=through_proxy, broker_url=broker_url,
                                     DISPATCHER_SWEEP_INTERVAL_S="5", DISPATCHER_STALE_AFTER_S="300")
        # the host hands over directly: only the workers live through the outage
        host = Dispatcher(example_settings(api_url=sandbox.base_url, database_url=fresh_postgres_url,
                                           broker_url=broker_url), enqueuer=CeleryEnqueuer(broker_url))
        with process_group(env, tmp_path) as group:
            group.start_worker("sender", concurrency=2)
            group.start_beat()
            yield host, group, proxy, sandbox


def _sent(host: Dispatcher, event_ids: list[str]) -> bool:
    return all(host.status(event_id).state in ACCEPTED for event_id in event_ids)


def test_sends_go_on_within_seconds_of_the_database_answering_again(
    stack: tuple[Dispatcher, ProcessGroup, TcpProxy, SandboxProcess],
) -> None:
    host, group, proxy, sandbox = stack
    before = [f"outage-before-{n}" for n in range(5)]
    for n, event_id in enumerate(before):
        host.notify(reminder(event_id, identifier=f"o-{n}", phone=f"+155503401{n:02d}"))
    wait_until(lambda: _sent(host, before), timeout_s=60, what="the first sends")

    # when the workers' database link is cut while notifications arrive, and comes back later
    proxy.cut()
    during = [f"outage-during-{n}" for n in range(10)]
    for n, event_id in enumerate(during):
        host.notify(reminder(event_id, identifier=f"o-{n % 5}", phone=f"+155503401{n % 5:02d}"))
    time.sleep(OUTAGE_S)  # the outage itself; the workers' tasks meet it meanwhile
    proxy.restore()

    # then every one is sent, once, long before the sweep's 300 s would have queued it again
    wait_until(lambda: _sent(host, during), timeout_s=60, what="the sends after the outage")
    per_event = Counter(message["content"].split(":")[0] for message in sandbox.messages())
    assert all(per_event[f"Reminder {event_id}"] == 1 for event_id in before + during), per_event
    assert "the database did not answer" in group.logs()
