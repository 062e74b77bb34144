"""CPU by component while another benchmark runs as a child process: a coarse profile.

Used by scripts/bench/run_all.py around scripts/bench/receiver.py: every 0.1 s it reads the
CPU times of the processes it recognises (by command line) and of PostgreSQL and Redis, keeps
each process's last reading, and remembers when each server process was first and last seen,
so PostgreSQL's and Redis's CPU can be split by the phase they served.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

Matcher = Callable[[str, str], bool]


class CpuMonitor:
    def __init__(self, servers: dict[str, Matcher], interval_s: float = 0.1) -> None:
        self.servers = servers
        self.interval_s = interval_s
        self.timeline: dict[int, tuple[str, list[tuple[float, float]]]] = {}  # pid -> (label, [(time, cpu s)])
        self.shared: list[tuple[float, float, float]] = []  # (time, postgresql cpu, redis cpu)
        self.root_pid: int | None = None  # when set, only this process's descendants are matched
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            postgres = redis = 0.0
            family: set[int] = set()
            if self.root_pid is not None:
                try:
                    family = {child.pid for child in psutil.Process(self.root_pid).children(recursive=True)}
                except psutil.NoSuchProcess:
                    family = set()
            for process in psutil.process_iter(["pid", "name", "cmdline", "cpu_times"]):
                times = process.info["cpu_times"]
                if times is None:
                    continue
                used = times.user + times.system
                name = process.info["name"] or ""
                command = " ".join(process.info["cmdline"] or [])
                if name.startswith("postgres"):
                    postgres += used
                    continue
                if name.startswith("redis-server"):
                    redis += used
                    continue
                if process.info["pid"] not in family:
                    continue
                for label, matches in self.servers.items():
                    if matches(name, command):
                        self.timeline.setdefault(process.info["pid"], (label, []))[1].append((now, used))
                        break
            self.shared.append((now, postgres, redis))
            self._stop.wait(self.interval_s)

    def report(self) -> dict[str, Any]:
        """Per label, its busiest stretch (the load, not the start-up): CPU seconds, length, the
        share of one core it kept busy, and PostgreSQL's and Redis's CPU over the same stretch."""
        out: dict[str, Any] = {}
        for label, samples in self.timeline.values():
            segment = _busiest(samples)
            if segment is None:
                continue
            (start, cpu_start), (end, cpu_end) = segment
            inside = [s for s in self.shared if start <= s[0] <= end]
            pg = inside[-1][1] - inside[0][1] if len(inside) > 1 else 0.0
            rd = inside[-1][2] - inside[0][2] if len(inside) > 1 else 0.0
            entry = out.setdefault(label, {"cpu_s": 0.0, "busy_s": 0.0, "postgresql_cpu_s": 0.0, "redis_cpu_s": 0.0})
            entry["cpu_s"] = round(entry["cpu_s"] + cpu_end - cpu_start, 2)
            entry["busy_s"] = round(entry["busy_s"] + end - start, 2)
            entry["postgresql_cpu_s"] = round(entry["postgresql_cpu_s"] + pg, 2)
            entry["redis_cpu_s"] = round(entry["redis_cpu_s"] + rd, 2)
        for entry in out.values():
            entry["core_share"] = round(entry["cpu_s"] / entry["busy_s"], 2) if entry["busy_s"] else None
        return out


def _busiest(samples: list[tuple[float, float]], busy_share: float = 0.2) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The contiguous run of samples using more than ``busy_share`` of a core that used the most CPU."""
    best, run_start = None, None
    for previous, current in zip(samples, samples[1:], strict=False):
        rate = (current[1] - previous[1]) / max(current[0] - previous[0], 1e-6)
        if rate > busy_share:
            run_start = run_start or previous
            if best is None or current[1] - run_start[1] > best[1][1] - best[0][1]:
                best = (run_start, current)
        else:
            run_start = None
    return best
