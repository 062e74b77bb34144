"""Settings: every source, and a bad or missing value named by its key without echoing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.errors import ConfigurationError
from dispatcher.settings import ChannelKind, load_settings
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "config" / "dispatcher.example.toml"
REQUIRED = {"api_url": "http://127.0.0.1:3000", "account_id": 1, "api_token": "tok-SECRET-123"}


@pytest.fixture()
def env(clean_environment: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    return clean_environment


def _error(**values: object) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**values)
    return caught.value


def test_example_file_loads_with_every_route_and_template(env: pytest.MonkeyPatch) -> None:
    env.setenv("DISPATCHER_CONFIG", str(EXAMPLE))
    settings = load_settings()
    assert settings.api_url == "http://127.0.0.1:3000"
    assert settings.account_id == 1
    assert set(settings.routes) == {"reminders", "sms", "email", "web_session", "portal"}
    assert settings.routes["reminders"].channel is ChannelKind.MESSAGING_PLATFORM
    assert settings.routes["reminders"].fallback == "sms"
    assert settings.template("appointment_reminder", "es") is not None
    assert settings.template("appointment_reminder", "fr") is None


def test_environment_overrides_the_file(env: pytest.MonkeyPatch) -> None:
    env.setenv("DISPATCHER_CONFIG", str(EXAMPLE))
    env.setenv("DISPATCHER_ACCOUNT_ID", "42")
    env.setenv("DISPATCHER_WEBHOOK_HEADER_PREFIX", "Chatwoot")
    settings = load_settings()
    assert settings.account_id == 42
    assert settings.webhook_header_prefix == "Chatwoot"


def test_defaults_need_no_server(env: pytest.MonkeyPatch) -> None:
    settings = load_settings(**REQUIRED)
    assert settings.database_url.startswith("sqlite:///")
    assert settings.broker_url == "filesystem://var/broker"
    assert settings.webhook_header_prefix == "auto"
    assert settings.webhook_header_prefixes == ("Chatwoot", "Service")  # a stock workspace, or the contract
    assert load_settings(**REQUIRED, webhook_header_prefix="AUTO").webhook_header_prefixes == ("Chatwoot", "Service")
    assert settings.webhook_replay_window_s == 300


def test_several_webhook_secrets_from_one_variable(env: pytest.MonkeyPatch) -> None:
    env.setenv("DISPATCHER_WEBHOOK_SECRETS", "new-secret, old-secret")
    settings = load_settings(**REQUIRED)
    assert [secret.get_secret_value() for secret in settings.webhook_secrets] == ["new-secret", "old-secret"]


def test_every_missing_required_key_is_named(env: pytest.MonkeyPatch) -> None:
    message = str(_error())
    for key in ("DISPATCHER_API_URL", "DISPATCHER_ACCOUNT_ID", "DISPATCHER_API_TOKEN"):
        assert key in message
    assert "required" in message


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("DISPATCHER_ACCOUNT_ID", "abc", "DISPATCHER_ACCOUNT_ID"),
        ("DISPATCHER_ACCOUNT_ID", "0", "DISPATCHER_ACCOUNT_ID"),
        ("DISPATCHER_API_URL", "ftp://example", "DISPATCHER_API_URL"),
        ("DISPATCHER_API_URL", "http://127.0.0.1:3000/api/v1", "DISPATCHER_API_URL"),
        ("DISPATCHER_API_TOKEN", "   ", "DISPATCHER_API_TOKEN"),
        ("DISPATCHER_WEBHOOK_REPLAY_WINDOW_S", "-5", "DISPATCHER_WEBHOOK_REPLAY_WINDOW_S"),
        ("DISPATCHER_WEBHOOK_HEADER_PREFIX", "X Bad", "DISPATCHER_WEBHOOK_HEADER_PREFIX"),
        ("DISPATCHER_HTTP_READ_TIMEOUT_S", "soon", "DISPATCHER_HTTP_READ_TIMEOUT_S"),
        ("DISPATCHER_WEBHOOK_PATH", "webhooks", "DISPATCHER_WEBHOOK_PATH"),
    ],
)
def test_a_wrong_value_names_its_key(env: pytest.MonkeyPatch, variable: str, value: str, named: str) -> None:
    for key, good in REQUIRED.items():
        env.setenv(f"DISPATCHER_{key.upper()}", str(good))
    env.setenv(variable, value)
    error = _error()
    assert error.key.startswith(named)
    assert named in str(error)


def test_the_token_never_appears_in_errors_or_repr(env: pytest.MonkeyPatch) -> None:
    secret = "tok-SECRET-123"
    error = _error(api_url="http://x", account_id="not-a-number", api_token=secret)
    assert secret not in str(error) and secret not in repr(error)
    settings = load_settings(**REQUIRED)
    assert secret not in repr(settings) and secret not in str(settings)
    assert settings.api_token.get_secret_value() == secret


def test_database_password_is_kept_out_of_repr(env: pytest.MonkeyPatch) -> None:
    settings = load_settings(**REQUIRED, database_url="postgresql+psycopg://app:pw-SECRET@db/dispatcher")
    assert "pw-SECRET" not in repr(settings)


@pytest.mark.parametrize(
    ("routes", "named"),
    [
        ({"a": {"channel": "sms"}}, "routes.a"),
        ({"a": {"inbox_id": 1, "inbox_name": "x", "channel": "sms"}}, "routes.a"),
        ({"a": {"inbox_id": 1, "channel": "pigeon"}}, "routes.a.channel"),
        ({"a": {"inbox_id": 1, "channel": "sms", "fallback": "b"}}, "routes.a.fallback"),
        ({"a": {"inbox_id": 1, "channel": "sms", "fallback": "a"}}, "routes.a.fallback"),
        ({"a": {"inbox_id": 1, "channel": "web_session"}}, "routes.a"),
        ({"a": {"inbox_id": 1, "channel": "sms", "colour": "red"}}, "routes.a.colour"),
        ({"Bad Name": {"inbox_id": 1, "channel": "sms"}}, "routes.Bad Name"),
    ],
)
def test_a_bad_route_is_named(env: pytest.MonkeyPatch, routes: dict[str, object], named: str) -> None:
    assert _error(**REQUIRED, routes=routes).key == named


@pytest.mark.parametrize(
    ("templates", "named"),
    [
        ([{"name": "t", "language": "en", "category": "PROMO", "body_params": 1}], "templates.0.category"),
        ([{"name": "t", "language": "en", "category": "UTILITY", "body_params": -1}], "templates.0.body_params"),
        ([{"name": "t", "language": "en", "category": "UTILITY"}], "templates.0.body_params"),
        (
            [
                {"name": "t", "language": "en", "category": "UTILITY", "body_params": 1},
                {"name": "t", "language": "en", "category": "UTILITY", "body_params": 2},
            ],
            "templates",
        ),
    ],
)
def test_a_bad_template_is_named(env: pytest.MonkeyPatch, templates: list[object], named: str) -> None:
    assert _error(**REQUIRED, templates=templates).key == named


def test_an_unknown_key_in_the_file_is_named(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "dispatcher.toml"
    config.write_text('api_url = "http://x"\naccount_id = 1\napi_token = "t"\nbroker_ur = "redis://"\n')
    env.setenv("DISPATCHER_CONFIG", str(config))
    assert _error().key.startswith("DISPATCHER_BROKER_UR")


def test_a_missing_or_broken_file_names_the_variable(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.setenv("DISPATCHER_CONFIG", str(tmp_path / "absent.toml"))
    assert _error().key == "DISPATCHER_CONFIG"
    broken = tmp_path / "broken.toml"
    broken.write_text("api_url = \n")
    env.setenv("DISPATCHER_CONFIG", str(broken))
    assert _error().key == "DISPATCHER_CONFIG"


def test_example_file_documents_every_setting() -> None:
    from dispatcher.settings import Settings

    text = EXAMPLE.read_text()
    for field in Settings.model_fields:
        assert f"{field} =" in text or f"[{field}." in text or f"[[{field}]]" in text, field


def test_a_countdown_that_would_outlive_the_visibility_timeout_is_refused(env: pytest.MonkeyPatch) -> None:
    # On a Redis broker a countdown held past the visibility timeout is delivered a second time.
    redis = {**REQUIRED, "broker_url": "redis://127.0.0.1:6379/0"}
    error = _error(**redis, retry_max_countdown_s=25.0)
    assert error.key == "DISPATCHER_RETRY_MAX_COUNTDOWN_S (retry_max_countdown_s)"
    assert "broker_visibility_timeout_s" in str(error) and "25" not in str(error)
    assert "\n" not in str(error)
    # Raising the visibility timeout with it is allowed; so is any countdown where no visibility
    # timeout applies (RabbitMQ requeues when the connection drops; the file broker by its lease).
    assert load_settings(**redis, retry_max_countdown_s=100.0, broker_visibility_timeout_s=110).retry_max_countdown_s == 100.0
    assert load_settings(**REQUIRED, broker_url="amqp://guest:guest@127.0.0.1:5672//",
                         retry_max_countdown_s=300.0).retry_max_countdown_s == 300.0


def test_the_defaults_bring_a_lost_workers_tasks_back_within_a_minute(env: pytest.MonkeyPatch) -> None:
    from dispatcher.queues import broker_transport_options

    settings = load_settings(**REQUIRED, broker_url="redis://127.0.0.1:6379/0")
    options = broker_transport_options(settings.broker_url, visibility_timeout_s=settings.broker_visibility_timeout_s)
    # kombu scans every unacked_restore_interval * unacked_restore_throttle seconds
    restore_period_s = options["unacked_restore_interval"] * options["unacked_restore_throttle"]
    assert options["visibility_timeout"] + restore_period_s <= 40  # 20 s left for the runs themselves
    assert options["unacked_mutex_expire"] < 60 - options["visibility_timeout"]
    assert settings.retry_max_countdown_s < settings.broker_visibility_timeout_s
    # RabbitMQ, SQLAlchemy and the file broker get none of the Redis options.
    for url in ("amqp://guest:guest@127.0.0.1:5672//", "sqla+sqlite:///x.sqlite"):
        assert "unacked_restore_interval" not in broker_transport_options(url)


def test_rabbitmq_publishes_wait_for_the_node_to_confirm_them() -> None:
    from dispatcher.queues import broker_transport_options

    for url in ("amqp://guest:guest@127.0.0.1:5672//", "amqps://broker.example/vhost", "pyamqp://127.0.0.1//"):
        assert broker_transport_options(url) == {"confirm_publish": True}
    for url in ("redis://127.0.0.1:6379/0", "sqla+sqlite:///x.sqlite", "filesystem:///tmp/broker"):
        assert "confirm_publish" not in broker_transport_options(url)


# -- one module per concern (issue 46: settings grouped by concern, not one 65-field object) --

def test_every_key_belongs_to_exactly_one_concern() -> None:
    import dispatcher.settings as settings_package
    from dispatcher.settings import Settings
    from dispatcher.settings.checks import Concern

    concerns = [kind for kind in Settings.__mro__ if issubclass(kind, Concern) and kind not in (Concern, Settings)]
    assert {kind.__name__ for kind in concerns} == {
        "WorkspaceApi", "Storage", "Limits", "Timers", "Routing", "Receiver", "Intake", "Callbacks", "Operators",
        "Retention"}
    owners: dict[str, list[str]] = {}
    for kind in concerns:
        assert getattr(settings_package, kind.__name__) is kind  # each one a name users can type against
        # its own keys only: a concern builds on no other concern
        assert [base for base in kind.__bases__] == [Concern], kind.__name__
        assert len(kind.model_fields) <= 15, f"{kind.__name__} has grown past one concern"
        for field in kind.model_fields:
            owners.setdefault(field, []).append(kind.__name__)
    assert {field: kinds for field, kinds in owners.items() if len(kinds) > 1} == {}
    # what no concern holds is the deployment's own: the further workspaces
    assert set(Settings.model_fields) - set(owners) == {"workspaces"}


def test_a_concern_stands_alone_with_its_own_checks() -> None:
    from pydantic import ValidationError

    from dispatcher.context import readback_plan_of, reads_per_minute
    from dispatcher.settings import Limits, Routing, Timers

    assert readback_plan_of(Timers(reconcile_after_s=7.0)).first_after_s == 7.0
    assert reads_per_minute(Limits(api_requests_per_minute=100, reads_fraction_of_api_requests=0.25)) == 25
    with pytest.raises(ValidationError, match="no route named"):
        Routing(routes={"sms": {"inbox_id": 1, "channel": "sms", "fallback": "email"}})
    with pytest.raises(ValidationError, match="time zone"):
        Routing(default_time_zone="Mars/Olympus")


def test_the_keys_keep_their_flat_names_and_their_order(env: pytest.MonkeyPatch) -> None:
    # Deployments set DISPATCHER_<KEY> and top-level TOML keys: the grouping renames none, and a
    # missing key is still named first in the order of the example file (the workspace API first).
    from dispatcher.settings import Settings

    assert list(Settings.model_fields)[:3] == ["api_url", "account_id", "api_token"]
    assert _error().key == "DISPATCHER_API_URL (api_url)"
