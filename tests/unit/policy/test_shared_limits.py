"""The workspace's limits are shared by every worker, or a worker does not start."""

from __future__ import annotations

import pytest

from dispatcher.context import require_shared_limits
from dispatcher.errors import ConfigurationError
from dispatcher.settings import load_settings

REQUIRED = {"api_url": "http://127.0.0.1:3000", "account_id": 1, "api_token": "tok-SECRET-123"}


@pytest.mark.parametrize(
    ("broker_url", "redis_url"),
    [
        ("redis://127.0.0.1:6379/0", None),  # shared through the broker
        ("amqp://guest:guest@127.0.0.1:5672//", "redis://127.0.0.1:6379/1"),  # shared through redis_url
        ("filesystem://var/broker", None),  # embedded: one machine, limits per process, documented
    ],
)
def test_limits_shared_or_embedded_are_accepted(clean_environment: pytest.MonkeyPatch, broker_url: str,
                                                redis_url: str | None) -> None:
    require_shared_limits(load_settings(**REQUIRED, broker_url=broker_url, redis_url=redis_url))


@pytest.mark.parametrize("broker_url", ["amqp://guest:pass-s3cret@127.0.0.1:5672//", "sqla+sqlite:///var/broker.sqlite"])
def test_a_server_broker_without_redis_is_refused_naming_the_setting(clean_environment: pytest.MonkeyPatch,
                                                                     broker_url: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        require_shared_limits(load_settings(**REQUIRED, broker_url=broker_url))
    assert refused.value.key == "DISPATCHER_REDIS_URL (redis_url)"
    assert "s3cret" not in str(refused.value)
