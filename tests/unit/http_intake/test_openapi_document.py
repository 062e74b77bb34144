"""The intake's OpenAPI document: served as docs/openapi/intake.json holds it, valid 3.1, built from the
models intake checks with (so the priority is in it), and the examples validate against it."""

from __future__ import annotations

import json

from jsonschema import FormatChecker
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from dispatcher.intake.openapi import OPENAPI_PATH
from tests.conftest import REPO_ROOT
from tests.unit.http_intake.conftest import AUTH, Intake, valid_request

DOCUMENT = REPO_ROOT / "docs" / "openapi" / "intake.json"
URI = "urn:notification-dispatcher:intake"


def _validator(document: dict[str, object], name: str) -> OAS31Validator:
    registry: Registry = Registry().with_resource(URI, Resource(contents=document, specification=DRAFT202012))
    return OAS31Validator({"$ref": f"{URI}#/components/schemas/{name}"}, registry=registry, format_checker=FormatChecker())


def test_the_served_document_is_the_one_in_docs_and_valid(intake: Intake) -> None:
    served = intake.client.get(OPENAPI_PATH)  # no token: it holds no data
    assert served.status_code == 200
    assert served.json() == json.loads(DOCUMENT.read_text())
    validate(served.json())


def test_requests_and_records_validate_and_the_priority_is_urgent_or_normal(intake: Intake) -> None:
    document = json.loads(DOCUMENT.read_text())
    requests = _validator(document, "NotificationRequest")
    example = json.loads((REPO_ROOT / "docs" / "examples" / "reminder.json").read_text())
    for request in (example, valid_request("o-1", priority="urgent"), valid_request("o-2", priority="normal")):
        assert list(requests.iter_errors(request)) == []
    assert list(requests.iter_errors(valid_request("o-3", priority="asap")))  # refused, as intake refuses it
    assert document["components"]["schemas"]["Priority"]["enum"] == ["urgent", "normal"]
    handed = intake.post(valid_request("o-4", priority="urgent"))
    assert handed.status_code == 202
    record = intake.client.get("/v1/notifications/o-4", headers=AUTH).json()
    assert list(_validator(document, "NotificationRecord").iter_errors(record)) == []
    assert record["priority"] == "urgent"
