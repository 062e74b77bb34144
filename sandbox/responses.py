"""Error answers and request parsing helpers shared by the route modules.

Every error body is a JSON object ``{"error": "..."}`` except 429, which the real service answers
with ``text/plain`` ``Retry later`` and no ``Retry-After`` header. Messages never echo request values.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import pydantic
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandbox.bodies import describe_errors

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


def retry_later() -> Response:
    return Response("Retry later", status_code=429, media_type="text/plain")


async def parse_body(request: Request, model: type[ModelT]) -> ModelT:
    """400 for a body that is not a JSON object, 422 for one that breaks the schema."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise HttpError(400, "Malformed JSON body") from None
    if not isinstance(data, dict):
        raise HttpError(400, "Body must be a JSON object")
    try:
        return model.model_validate(data, strict=True)
    except pydantic.ValidationError as exc:
        raise HttpError(422, "Invalid request body", details=describe_errors(exc.errors())) from None


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
