"""docker-compose.yml and the Dockerfile, checked against the CLI and the settings (no Docker needed).

Every dispatcher service's command must be a real `dispatcher` subcommand with real options,
every DISPATCHER_* variable a key the settings know, and no secret may be written in the file.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from dispatcher.operations.cli.main import cli
from dispatcher.settings import CONFIG_FILE_VARIABLE, ENV_PREFIX, Settings, load_settings
from tests.conftest import REPO_ROOT

COMPOSE_PATH = REPO_ROOT / "docker-compose.yml"
DOCKERFILE_PATH = REPO_ROOT / "Dockerfile"
IMAGE = "notification-dispatcher:local"

# service -> the `dispatcher` subcommand it runs
EXPECTED_COMMANDS = {
    "migrate": ["db", "upgrade"],
    "worker": ["worker"],
    "consumer": ["consumer"],
    "beat": ["beat"],
    "receiver": ["receiver"],
    "flower": ["flower"],
    "sandbox": ["sandbox"],
}
INFRASTRUCTURE = {"redis", "postgres"}
AFTER_MIGRATIONS = ["worker", "consumer", "beat", "receiver"]
REQUIRED_ENVIRONMENT = {
    "DISPATCHER_API_URL",
    "DISPATCHER_ACCOUNT_ID",
    "DISPATCHER_API_TOKEN",
    "DISPATCHER_DATABASE_URL",
    "DISPATCHER_BROKER_URL",
    "DISPATCHER_WEBHOOK_SECRETS",
    "DISPATCHER_WEBHOOK_HEADER_PREFIX",
    "DISPATCHER_CONFIG",
}
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL|PRIVATE", re.IGNORECASE)
REQUIRED_REFERENCE = re.compile(r"^\$\{(?P<name>[A-Z][A-Z0-9_]*):\?[^}]+\}$")
OPTIONAL_EMPTY_REFERENCE = re.compile(r"^\$\{(?P<name>[A-Z][A-Z0-9_]*):-\}$")
URL_PASSWORD = re.compile(r"^[a-z][a-z0-9+.-]*://[^:/@\s]+:(?P<password>\$\{[^}]*\}|[^@\s]*)@")
INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:\?|:-|\?|-)(?P<arg>[^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_PATH.read_text(encoding="utf-8"))
    assert isinstance(document, dict), "docker-compose.yml is not a mapping"
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _environment(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):  # the "KEY=value" list form
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in raw)
    return {str(key): "" if value is None else str(value) for key, value in raw.items()}


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    assert isinstance(command, list), "write commands in list form, so no shell splits them"
    return [str(part) for part in command]


def _resolve(tokens: list[str]) -> tuple[list[str], click.Command, list[str]]:
    """Walk `dispatcher` groups along the tokens: (the command path, the command, its arguments)."""
    command: click.Command = cli
    path: list[str] = []
    rest = list(tokens)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        assert name in command.commands, f"`dispatcher {' '.join([*path, name])}` is not a command of the CLI"
        command = command.commands[name]
        path.append(name)
    assert not isinstance(command, click.Group), f"`dispatcher {' '.join(path)}` is a group, not a command"
    return path, command, rest


def _options_of(command: click.Command) -> dict[str, click.Parameter]:
    return {opt: param for param in command.params for opt in (*param.opts, *param.secondary_opts)
            if isinstance(param, click.Option)}


def _interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}, with `variables` as the shell."""

    def substitute(match: re.Match[str]) -> str:
        name, op, arg = match.group("name"), match.group("op"), match.group("arg")
        if name in variables and (variables[name] or op not in (":-", ":?")):
            return variables[name]
        if op in (":-", "-"):
            return arg or ""
        raise AssertionError(f"${{{name}}} is required but the test did not set it")

    return INTERPOLATION.sub(substitute, value.replace("$$", "\0")).replace("\0", "$")


# -- services ----------------------------------------------------------------------------------

def test_the_expected_services_exist(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == set(EXPECTED_COMMANDS) | INFRASTRUCTURE


def test_infrastructure_images(services: dict[str, dict[str, Any]]) -> None:
    assert services["redis"]["image"] == "redis:7"
    assert services["postgres"]["image"] == "postgres:15"
    postgres_volumes = services["postgres"].get("volumes") or []
    assert any(str(volume).endswith(":/var/lib/postgresql/data") for volume in postgres_volumes), "PostgreSQL data needs a volume"


def test_dispatcher_services_run_the_image_with_its_entrypoint(services: dict[str, dict[str, Any]]) -> None:
    runs_image = {name for name, service in services.items() if service.get("image") == IMAGE or "build" in service}
    assert runs_image == set(EXPECTED_COMMANDS)
    for name in runs_image:
        assert services[name].get("image") == IMAGE, name
        assert services[name].get("build") == ".", name
        assert "entrypoint" not in services[name], f"{name} must keep the image's `dispatcher` entrypoint"


@pytest.mark.parametrize("name", sorted(EXPECTED_COMMANDS))
def test_each_command_is_a_real_dispatcher_command_with_real_options(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    path, command, arguments = _resolve(_command(services[name]))
    assert path == EXPECTED_COMMANDS[name]
    options = _options_of(command)
    context = click.Context(command, info_name=path[-1])
    index = 0
    while index < len(arguments):
        token = arguments[index]
        assert token.startswith("-"), f"{name}: unexpected argument {token!r} for `dispatcher {' '.join(path)}`"
        option_name, equals, inline_value = token.partition("=")
        assert option_name in options, f"{name}: `dispatcher {' '.join(path)}` has no option {option_name}"
        param = options[option_name]
        assert isinstance(param, click.Option)
        if param.is_flag:
            assert not equals, f"{name}: {option_name} is a flag"
            index += 1
            continue
        if equals:
            value = inline_value
            index += 1
        else:
            assert index + 1 < len(arguments), f"{name}: {option_name} needs a value"
            value = arguments[index + 1]
            index += 2
        if not isinstance(param.type, click.Path):  # paths exist only inside the container
            param.type.convert(value, param, context)  # raises click.BadParameter on a wrong value


def test_worker_is_scaled_and_beat_is_single(services: dict[str, dict[str, Any]]) -> None:
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert services["beat"].get("deploy", {}).get("replicas", 1) == 1


def test_migrations_run_once(services: dict[str, dict[str, Any]]) -> None:
    migrate = services["migrate"]
    assert str(migrate.get("restart")) == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", AFTER_MIGRATIONS)
def test_migrate_runs_before_the_processes_that_use_the_store(services: dict[str, dict[str, Any]], name: str) -> None:
    depends_on = services[name]["depends_on"]
    assert isinstance(depends_on, dict), f"{name}: depends_on needs conditions"
    assert depends_on["migrate"]["condition"] == "service_completed_successfully"
    assert depends_on["redis"]["condition"] == "service_healthy"
    assert depends_on["postgres"]["condition"] == "service_healthy"


def test_flower_waits_for_the_broker(services: dict[str, dict[str, Any]]) -> None:
    assert services["flower"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_published_ports(services: dict[str, dict[str, Any]]) -> None:
    def published(name: str) -> list[str]:
        return [str(port) for port in services[name].get("ports", [])]

    assert any(port.endswith(":8080") for port in published("receiver"))
    # Flower and the sandbox are for operators: reachable from the host's loopback only.
    assert published("flower") and all(port.startswith("127.0.0.1:") and port.endswith(":5555") for port in published("flower"))
    assert published("sandbox") and all(port.startswith("127.0.0.1:") and port.endswith(":3000") for port in published("sandbox"))
    command = _command(services["receiver"])
    assert command[command.index("--port") + 1] == "8080"
    command = _command(services["flower"])
    assert command[command.index("--port") + 1] == "5555"


# -- the sandbox profile -------------------------------------------------------------------------

def test_the_sandbox_runs_only_in_its_profile(services: dict[str, dict[str, Any]]) -> None:
    assert services["sandbox"].get("profiles") == ["sandbox"]
    for name, service in services.items():
        if name != "sandbox":
            assert not service.get("profiles"), f"{name} must start without a profile"
            assert "sandbox" not in (service.get("depends_on") or {}), f"{name} cannot depend on a profile service"


def test_the_sandbox_may_deliver_webhooks_to_the_receiver(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    command = _command(services["sandbox"])
    target = command[command.index("--config") + 1]
    mounted = {entry["target"]: entry["source"] for entry in services["sandbox"].get("configs", [])}
    assert target in mounted
    seed = tomllib.loads(compose["configs"][mounted[target]]["content"])
    assert "receiver" in seed["webhooks"]["allowed_hosts"]
    assert not _environment(services["sandbox"]), "the sandbox shares no configuration with the dispatcher"


# -- environment --------------------------------------------------------------------------------

def _known_keys() -> set[str]:
    return {f"{ENV_PREFIX}{field.upper()}" for field in Settings.model_fields} | {CONFIG_FILE_VARIABLE}


def test_every_dispatcher_variable_is_a_setting(services: dict[str, dict[str, Any]]) -> None:
    known = _known_keys()
    seen = set()
    for name, service in services.items():
        for key in _environment(service):
            if key.startswith(ENV_PREFIX):
                assert key in known, f"{name}: {key} is not a setting"
                seen.add(key)
    assert REQUIRED_ENVIRONMENT <= seen


@pytest.mark.parametrize("name", [name for name in EXPECTED_COMMANDS if name != "sandbox"])
def test_every_dispatcher_process_gets_the_shared_environment(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], name: str
) -> None:
    shared = {str(key): str(value) for key, value in compose["x-dispatcher-env"].items()}
    assert set(shared) == REQUIRED_ENVIRONMENT
    environment = _environment(services[name])
    assert {key: environment.get(key) for key in shared} == shared
    volumes = [str(volume) for volume in services[name].get("volumes", [])]
    assert any(volume.startswith("./config:") for volume in volumes), f"{name}: ./config is not mounted"


def test_storage_and_broker_point_at_the_compose_services(compose: dict[str, Any]) -> None:
    shared = compose["x-dispatcher-env"]
    assert re.match(r"^postgresql\+psycopg://dispatcher:\$\{[^}]+\}@postgres:5432/dispatcher$", shared["DISPATCHER_DATABASE_URL"])
    assert shared["DISPATCHER_BROKER_URL"] == "redis://redis:6379/0"


REQUIRED_SHELL = {
    "DISPATCHER_API_URL": "https://workspace.example.org",
    "DISPATCHER_ACCOUNT_ID": "7",
    "DISPATCHER_API_TOKEN": "token-from-the-secret-store",
    "POSTGRES_PASSWORD": "pw",
}


@pytest.mark.parametrize(
    ("shell", "header_prefix", "webhook_secrets"),
    [
        (REQUIRED_SHELL, "auto", []),  # the file's defaults for everything optional
        ({**REQUIRED_SHELL, "DISPATCHER_WEBHOOK_HEADER_PREFIX": "Chatwoot", "DISPATCHER_WEBHOOK_SECRETS": "new,old"},
         "Chatwoot", ["new", "old"]),
    ],
    ids=["required-only", "everything"],
)
def test_the_shared_environment_makes_valid_settings(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], clean_environment: pytest.MonkeyPatch,
    shell: dict[str, str], header_prefix: str, webhook_secrets: list[str],
) -> None:
    # Given the values an operator puts in .env, and ./config where the container mounts it
    mount = next(str(v) for v in services["worker"]["volumes"] if str(v).startswith("./config:"))
    container_dir = mount.split(":")[1]
    for key, value in compose["x-dispatcher-env"].items():
        resolved = _interpolate(str(value), shell)
        if key == CONFIG_FILE_VARIABLE:
            assert resolved.startswith(container_dir + "/")
            resolved = str(REPO_ROOT / "config" / Path(resolved).relative_to(container_dir))
        clean_environment.setenv(key, resolved)
    # When the settings read them, Then they are valid and carry the shell's values
    settings = load_settings()
    assert settings.api_url == "https://workspace.example.org"
    assert settings.account_id == 7
    assert settings.api_token.get_secret_value() == "token-from-the-secret-store"
    assert settings.database_url == "postgresql+psycopg://dispatcher:pw@postgres:5432/dispatcher"
    assert settings.broker_url == "redis://redis:6379/0"
    assert settings.webhook_header_prefix == header_prefix
    assert [secret.get_secret_value() for secret in settings.webhook_secrets] == webhook_secrets


# -- secrets ------------------------------------------------------------------------------------

def test_no_secret_is_written_in_the_file(services: dict[str, dict[str, Any]]) -> None:
    checked = 0
    for name, service in services.items():
        for key, value in _environment(service).items():
            if SECRET_NAME.search(key):
                checked += 1
                assert REQUIRED_REFERENCE.match(value) or OPTIONAL_EMPTY_REFERENCE.match(value), (
                    f"{name}: {key} must come from the environment as ${{VAR:?...}}, not be written here"
                )
            password = URL_PASSWORD.match(value)
            if password:
                assert REQUIRED_REFERENCE.match(password.group("password")), f"{name}: {key} has a literal password"
    assert checked >= 4  # the API token, the webhook secrets, PostgreSQL's and Flower's passwords


def test_the_api_token_is_required_from_the_environment(compose: dict[str, Any]) -> None:
    match = REQUIRED_REFERENCE.match(compose["x-dispatcher-env"]["DISPATCHER_API_TOKEN"])
    assert match and match.group("name") == "DISPATCHER_API_TOKEN"


def test_flower_requires_basic_auth_from_the_environment(services: dict[str, dict[str, Any]]) -> None:
    match = REQUIRED_REFERENCE.match(_environment(services["flower"]).get("FLOWER_BASIC_AUTH", ""))
    assert match and match.group("name") == "FLOWER_BASIC_AUTH"
    assert not any("basic" in part.lower() for part in _command(services["flower"])), "no credential on the command line"


def test_no_known_sample_secret_appears() -> None:
    text = COMPOSE_PATH.read_text(encoding="utf-8") + DOCKERFILE_PATH.read_text(encoding="utf-8")
    example = tomllib.loads((REPO_ROOT / "config" / "dispatcher.example.toml").read_text(encoding="utf-8"))
    assert example["api_token"] not in text


# -- health checks ------------------------------------------------------------------------------

def _health_test(service: dict[str, Any]) -> str:
    check = service.get("healthcheck")
    assert check, "no healthcheck"
    test = check["test"]
    assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL")
    return " ".join(str(part) for part in test[1:])


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("redis", r"^redis-cli ping$"),
        ("postgres", r"^pg_isready\b"),
        ("receiver", r"http://127\.0\.0\.1:8080/healthz\b"),
        ("sandbox", r"http://127\.0\.0\.1:3000/_sandbox/health\b"),
        ("flower", r"http://127\.0\.0\.1:5555/healthcheck\b"),
        ("worker", r"celery -A workers\.app inspect ping --destination celery@\$\$HOSTNAME\b"),
        ("consumer", r"celery -A workers\.app inspect ping --destination celery@\$\$HOSTNAME\b"),
    ],
)
def test_health_checks(services: dict[str, dict[str, Any]], name: str, pattern: str) -> None:
    assert re.search(pattern, _health_test(services[name])), f"{name}: health check {_health_test(services[name])!r}"


def test_worker_health_checks_use_the_default_node_name(services: dict[str, dict[str, Any]]) -> None:
    # The check pings celery@$HOSTNAME, so the command must not rename the node.
    for name in ("worker", "consumer"):
        assert not any(part in ("--hostname", "-n") or part.startswith("--hostname=") for part in _command(services[name]))


# -- Dockerfile ---------------------------------------------------------------------------------

def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE_PATH.read_text(encoding="utf-8").replace("\\\n", " ")
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_the_dockerfile_entrypoint_is_the_dispatcher_cli() -> None:
    instructions = _dockerfile_instructions()
    entrypoints = [rest for keyword, rest in instructions if keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    assert json.loads(entrypoints[0]) == ["dispatcher"]
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert "dispatcher" in scripts


def test_the_image_is_slim_python_and_runs_as_a_user() -> None:
    instructions = _dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert any(keyword == "RUN" and re.search(r"\bpip install\b.*\s\"?\.(\[[a-z,]+\])?\"?(\s|$)", rest) for keyword, rest in instructions)
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_the_build_context_leaves_out_local_state_and_secrets() -> None:
    ignored = {line.strip() for line in (REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()}
    assert {".git", ".venv", ".env", "var"} <= ignored
