"""The HTTP intake's OpenAPI document, built from the request and record models themselves, so it
cannot drift from what intake checks: served at ``GET /v1/openapi.json`` and kept in
docs/openapi/intake.json (a test compares the two)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from dispatcher.intake.request import NotificationRequest
from dispatcher.store.record import NotificationRecord

OPENAPI_PATH = "/v1/openapi.json"
_REF = "#/components/schemas/"


def _schema(model: type[BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's schema with its nested models moved to the components (OpenAPI's ``$ref``s)."""
    schema = model.model_json_schema(ref_template=_REF + "{model}")
    nested = schema.pop("$defs", {})
    return schema, nested


def _json(ref: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": _REF + ref}}}}


def _error() -> dict[str, Any]:
    return {"description": "refused: the field at fault and what is wrong with it (never its value)",
            **_json("Error")}


def intake_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the HTTP intake's hand-over, batch and status (docs/http-intake.md)."""
    request, request_nested = _schema(NotificationRequest)
    record, record_nested = _schema(NotificationRecord)
    schemas: dict[str, Any] = {**request_nested, **record_nested, "NotificationRequest": request,
                               "NotificationRecord": record}
    schemas["Error"] = {"type": "object", "required": ["error", "field", "detail"], "properties": {
        "error": {"type": "string"}, "field": {"type": "string"}, "detail": {"type": "string"}}}
    schemas["Accepted"] = {"type": "object", "required": ["event_id", "state", "status_url"], "properties": {
        "event_id": {"type": "string"}, "state": {"type": "string"}, "status_url": {"type": "string"}}}
    schemas["Batch"] = {"type": "object", "required": ["notifications"], "additionalProperties": False, "properties": {
        "notifications": {"type": "array", "maxItems": 1000, "items": {"$ref": _REF + "NotificationRequest"}}}}
    schemas["BatchResults"] = {"type": "object", "required": ["results"], "properties": {"results": {
        "type": "array", "items": {"type": "object", "required": ["index", "event_id", "outcome"], "properties": {
            "index": {"type": "integer"}, "event_id": {"type": ["string", "null"]},
            "outcome": {"enum": ["accepted", "duplicate", "refused"]}, "state": {"type": "string"},
            "field": {"type": "string"}, "detail": {"type": "string"}}}}}}
    bearer: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "notification-dispatcher HTTP intake", "version": "1",
                 "description": "Hand over business events to notify about (docs/http-intake.md). A request's "
                                "priority, urgent or normal, chooses its lane (docs/priorities.md)."},
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/v1/notifications": {"post": {
                "operationId": "notify", "security": bearer,
                "requestBody": {"required": True, **_json("NotificationRequest")},
                "responses": {"202": {"description": "stored and queued (or scheduled)", **_json("Accepted")},
                              "409": _error(), "422": _error(), "429": _error()}}},
            "/v1/notification-batches": {"post": {
                "operationId": "notifyMany", "security": bearer,
                "requestBody": {"required": True, **_json("Batch")},
                "responses": {"200": {"description": "a result per item, in their order", **_json("BatchResults")},
                              "422": _error(), "429": _error()}}},
            "/v1/notifications/{event_id}": {"get": {
                "operationId": "status", "security": bearer,
                "parameters": [{"name": "event_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the notification's record", **_json("NotificationRecord")},
                              "404": _error()}}},
        },
    }
