"""Load the OpenAPI description of the messaging contract and validate bodies against it.

Used by the unit test of the description and by the sandbox conformance test, so both read the same
file the same way. Request and response bodies are checked with the OpenAPI 3.1 dialect
(``openapi_schema_validator.OAS31Validator``); ``$ref`` pointers resolve inside the one document.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import FormatChecker
from openapi_schema_validator import OAS31Validator, oas31_format_checker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = REPO_ROOT / "docs" / "openapi" / "messaging-api.yaml"
SPEC_URI = "urn:notification-dispatcher:messaging-api"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# An absolute URI (RFC 3986 section 4.3): a scheme, a colon, no whitespace. jsonschema checks "uri"
# only when the optional rfc3987 package is present; this keeps the check from being silently off.
_ABSOLUTE_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:[^\s]+$")


@cache
def load_spec() -> dict[str, Any]:
    """The parsed description (cached; callers must not mutate it)."""
    with SPEC_PATH.open(encoding="utf-8") as handle:
        spec = yaml.safe_load(handle)
    if not isinstance(spec, dict):
        raise TypeError(f"{SPEC_PATH} does not hold a mapping")
    return spec


def iter_operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Yield (path, method, operation) for every operation in the description."""
    for path, item in spec["paths"].items():
        for method in HTTP_METHODS:
            if method in item:
                yield path, method, item[method]


def operations_by_id(spec: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    return {op["operationId"]: (path, method, op) for path, method, op in iter_operations(spec)}


def resolve(spec: dict[str, Any], node: Any) -> Any:
    """Follow local ``$ref`` pointers until a non-reference node is reached."""
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"only local references are used, found {ref!r}")
        target: Any = spec
        for part in ref[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        node = target
    return node


def format_checker() -> FormatChecker:
    checker = FormatChecker()
    for name, func in oas31_format_checker.checkers.items():
        checker.checkers[name] = func
    checker.checkers["uri"] = (lambda value: not isinstance(value, str) or bool(_ABSOLUTE_URI.match(value)), ())
    return checker


def validator_for(schema: dict[str, Any], spec: dict[str, Any] | None = None) -> OAS31Validator:
    """A validator for ``schema`` (usually a ``{"$ref": "#/..."}`` node of the description)."""
    spec = load_spec() if spec is None else spec
    registry: Registry = Registry().with_resource(SPEC_URI, Resource(contents=spec, specification=DRAFT202012))
    return OAS31Validator(_rebase_refs(schema), registry=registry, format_checker=format_checker())


def _rebase_refs(node: Any) -> Any:
    """Point local ``#/...`` references of a node taken out of the document back at the document."""
    if isinstance(node, dict):
        return {
            key: SPEC_URI + value if _is_local_ref(key, value) else _rebase_refs(value) for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rebase_refs(item) for item in node]
    return node


def _is_local_ref(key: str, value: Any) -> bool:
    return key == "$ref" and isinstance(value, str) and value.startswith("#/")


def request_schema(operation_id: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = load_spec() if spec is None else spec
    _, _, operation = operations_by_id(spec)[operation_id]
    body = resolve(spec, operation["requestBody"])
    return body["content"]["application/json"]["schema"]


def response_schema(
    operation_id: str, status: str, media_type: str = "application/json", spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec = load_spec() if spec is None else spec
    _, _, operation = operations_by_id(spec)[operation_id]
    response = resolve(spec, operation["responses"][status])
    return response["content"][media_type]["schema"]


def validation_errors(schema: dict[str, Any], instance: Any) -> list[str]:
    """Every schema violation of ``instance``, as short readable lines (empty when it validates)."""
    errors = validator_for(schema).iter_errors(instance)
    return [f"{'/'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}" for error in errors]
