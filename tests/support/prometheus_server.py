"""A real Prometheus server for integration tests: on a free loopback port, with its own temporary
storage and a configuration written for the test (the jobs and targets it scrapes, the rule files
it evaluates), scraping and evaluating every second. Stopped (killed after 10 s) on exit.

Debian's ``prometheus`` package provides it; ``scripts/test`` installs it when missing, and a test
that needs it fails without it rather than being skipped.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml  # type: ignore[import-untyped]

from tests.support.ports import listens, stop
from tests.support.sandbox_process import free_port

STARTUP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Alert:
    """One alert as Prometheus's ``/api/v1/alerts`` reports it."""

    name: str
    state: str  # pending or firing
    labels: Mapping[str, str]


@dataclass
class PrometheusProcess:
    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path

    def alerts(self) -> list[Alert]:
        answer = httpx.get(f"{self.base_url}/api/v1/alerts", timeout=5).json()
        return [Alert(alert["labels"]["alertname"], alert["state"], alert["labels"]) for alert in answer["data"]["alerts"]]

    def query(self, expression: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples: ``{"metric": {...}, "value": [t, "v"]}``)."""
        answer = httpx.get(f"{self.base_url}/api/v1/query", params={"query": expression}, timeout=5).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]  # type: ignore[no-any-return]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def rules_with_short_for(rules: Path, folder: Path, *, for_: str) -> Path:
    """A copy of the rule file in ``folder`` with every rule's ``for:`` set to ``for_``, and nothing
    else changed: the expressions stay the shipped ones."""
    loaded = yaml.safe_load(rules.read_text())
    for group in loaded["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = for_
    copy = folder / rules.name
    copy.write_text(yaml.safe_dump(loaded, sort_keys=False))
    return copy


@contextlib.contextmanager
def running_prometheus(jobs: Mapping[str, Sequence[str]], *, rule_files: Sequence[Path], folder: Path,
                       interval: str = "1s") -> Iterator[PrometheusProcess]:
    """Prometheus scraping ``jobs`` (job name -> ``host:port`` targets, path /metrics) and evaluating
    ``rule_files`` every ``interval``; its configuration, storage and log live in ``folder``."""
    program = shutil.which("prometheus")
    assert program is not None, "prometheus is missing: install Debian's prometheus package (scripts/test does)"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]} for job, targets in jobs.items()],
    }
    config_path = folder / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    storage = folder / "tsdb"
    log_path = folder / "prometheus.log"
    for _ in range(3):  # another test's server may take the port between the choice and the bind
        port = free_port()
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [program, f"--config.file={config_path}", f"--storage.tsdb.path={storage}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        server = PrometheusProcess(process, f"http://127.0.0.1:{port}", log_path)
        if _ready(server, port):
            break
        stop(process)
    else:
        raise AssertionError(f"Prometheus did not start:\n{log_path.read_text(errors='replace')[-4000:]}")
    try:
        yield server
    finally:
        stop(process)


def _ready(server: PrometheusProcess, port: int) -> bool:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{server.base_url}/-/ready", timeout=1).status_code == 200 and listens(server.process.pid, port):
                return True
        time.sleep(0.2)
    return False


