"""Error answers and request parsing helpers shared by the route modules.

Every error body is a JSON object ``{"error": "..."}`` except 429, which the real service answers
with ``text/plain`` ``Retry later`` and no ``Retry-After`` header, and a stock validation failure
(``{"message": "...", "attributes": [...]}``, :func:`validation_error`). Messages never echo
request values.

A body is read as JSON only when the request says ``Content-Type: application/json`` (parameters
such as ``charset`` allowed), as the real service's framework does: otherwise its fields are not
read at all.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import pydantic
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandbox.bodies import describe_errors
from sandbox.profiles import Profile

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


class HttpError(Exception):
    """Raised by handlers; turned into a JSON error answer by the operation wrapper."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


def json_error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def validation_error(dialect: Profile, message: str, attributes: list[str], *, status: int = 422) -> JSONResponse:
    """A record the service refused as invalid, in the profile's shape (stock: no ``error`` key)."""
    return JSONResponse({dialect.validation_error_key: message, "attributes": attributes}, status_code=status)


def is_json(request: Request) -> bool:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media_type == "application/json"


def retry_later() -> Response:
    return Response("Retry later", status_code=429, media_type="text/plain")


async def parse_body(request: Request, model: type[ModelT]) -> ModelT:
    """400 for a body that is not a JSON object, 422 for one that breaks the schema.

    Without a JSON content type the body is not read: the request has no fields (then usually 422).
    """
    return validate_model(model, await read_json_object(request))


def validate_model(model: type[ModelT], data: dict[str, Any]) -> ModelT:
    """422 naming the fields (never their values) for data that breaks the schema."""
    try:
        return model.model_validate(data, strict=True)
    except pydantic.ValidationError as exc:
        raise HttpError(422, "Invalid request body", details=describe_errors(exc.errors())) from None


async def read_json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object; ``{}`` when the request does not say it is JSON."""
    raw = await request.body()
    if not is_json(request):
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise HttpError(400, "Malformed JSON body") from None
    if not isinstance(data, dict):
        raise HttpError(400, "Body must be a JSON object")
    return data


def int_query(request: Request, name: str, *, default: int | None = None, minimum: int | None = None) -> int | None:
    """An integer query parameter; 400 when it is not one (or below ``minimum``)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HttpError(400, f"{name} must be an integer") from None
    if minimum is not None and value < minimum:
        raise HttpError(400, f"{name} must be at least {minimum}")
    return value
