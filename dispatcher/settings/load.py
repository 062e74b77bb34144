"""Reading the settings: the one reader of the environment and the configuration file. A wrong
or missing value fails at start-up with :class:`~dispatcher.errors.ConfigurationError` naming the
key; the message never repeats the offending value, because that value may be the API token or a
webhook secret."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dispatcher.errors import ConfigurationError
from dispatcher.settings.checks import CONFIG_FILE_VARIABLE, ENV_PREFIX
from dispatcher.settings.deployment import Settings


def load_settings(**overrides: Any) -> Settings:
    """Read and check the settings; raise ConfigurationError naming the first bad key."""
    config_path = os.environ.get(CONFIG_FILE_VARIABLE)
    if config_path:
        _check_config_file(Path(config_path))
    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise _configuration_error(error) from None


def _check_config_file(path: Path) -> None:
    if not path.is_file():
        raise ConfigurationError(CONFIG_FILE_VARIABLE, f"no such file: {path}")
    try:
        tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigurationError(CONFIG_FILE_VARIABLE, f"{path} is not valid TOML: {error}") from None


def _configuration_error(error: ValidationError) -> ConfigurationError:
    """Name the key of every problem, and never echo a value (it may be a secret)."""
    named = [_name_problem(problem) for problem in error.errors(include_input=False, include_url=False)]
    key, message = named[0]
    others = "; ".join(f"{other_key}: {other}" for other_key, other in named[1:])
    return ConfigurationError(key, f"{message}; {others}" if others else message)


def _name_problem(problem: Any) -> tuple[str, str]:
    location = [str(part) for part in problem["loc"]]
    message = str(problem["msg"]).removeprefix("Value error, ")
    if problem["type"] == "missing":
        message = "is required but not set"
    if not location:  # a model-level check: its message starts with the key it names
        key, _, rest = message.partition(": ")
        return key, rest or message
    if len(location) == 1:
        return f"{ENV_PREFIX}{location[0].upper()} ({location[0]})", message
    return ".".join(location), message
