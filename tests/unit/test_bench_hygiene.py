"""The benchmarks touch only what they make: no script under scripts/ names the machine's Redis
or flushes a Redis it did not start (each runs a redis-server of its own, scripts/bench/common.py)."""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT

SCRIPTS = [path for path in (REPO_ROOT / "scripts").rglob("*") if path.is_file() and path.suffix in {".py", ""}]


def test_no_script_uses_the_machine_redis() -> None:
    # a URL on 6379, or a client made without one (redis-py's default is localhost:6379)
    machine_redis = re.compile(r"redis://[^\"'\s]*:6379|StrictRedis\(\s*\)|Redis\(\s*\)")
    offenders = [str(path.relative_to(REPO_ROOT)) for path in SCRIPTS if machine_redis.search(path.read_text(errors="replace"))]
    assert offenders == []


def test_flushes_happen_only_on_a_redis_of_the_script_s_own() -> None:
    for path in SCRIPTS:
        text = path.read_text(errors="replace")
        if ".flushdb(" in text or "flushall" in text.lower():
            assert "private_redis" in text or "PrivateRedis" in text, path.relative_to(REPO_ROOT)
