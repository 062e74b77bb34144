"""The two faces the sandbox can show: a stock workspace (the default) and the contract's nominal one.

**stock** is what the field notes (``shared/field-notes.md``) report for the stock release of the
real service (4.15): it is what a user's dispatcher meets in production, so the demo, the tests and
the benchmarks run against it unless they say otherwise. **contract** keeps the shapes the contract
names (``X-Service-*`` headers, a top-level ``status`` in message events, retried deliveries, 400
for a duplicate contact, 403 for a token without access), for tests that a client tolerates both.

A profile is data, not branches spread through the handlers: each difference is one named field
below, read where the shape is made. Four of them are also settings (``[webhooks]`` header_prefix,
include_status, max_retries; ``[behaviour]`` contact_search_per_minute): a file may override them
one by one, and what it leaves out comes from the profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ProfileName = Literal["stock", "contract"]
PROFILE_NAMES: tuple[ProfileName, ...] = ("stock", "contract")
DEFAULT_PROFILE: ProfileName = "stock"


@dataclass(frozen=True)
class Profile:
    name: ProfileName
    # -- webhook deliveries -----------------------------------------------------------------------
    header_prefix: str  # X-<prefix>-Delivery, -Timestamp, -Signature
    event_status: bool  # message events carry a top-level "status"
    event_message_type: Literal["name", "number"]  # "incoming" / 0
    event_created_at: Literal["iso", "unix"]  # "2026-11-25T10:00:00.123Z" / 1795600000
    event_sender: Literal["stock", "contract"]  # see shapes.event_sender
    escape_html_in_json: bool  # "<" as \u003c, as Rails writes JSON; the signature covers these bytes
    webhook_retries: int  # retries of a failed delivery (stock: never)
    # -- API answers --------------------------------------------------------------------------------
    contact_search_per_minute: int  # per account; 0 = unlimited
    validation_error_key: Literal["message", "error"]  # {"message": ..., "attributes": [...]}
    duplicate_contact_status: int  # field notes: 422; contract: 400
    duplicate_webhook_url_refused: bool  # a URL the account already has answers 422
    no_access_status: int  # a token without access to the account: 401 (stock) / 403
    missing_token_body: Literal["devise", "error"]  # {"errors": ["You need to sign in ..."]}
    current_page: Literal["int_then_string", "int"]  # stock: 1 without page, "2" with page=2
    flat_webhook_body: bool  # createWebhook also takes {"url", "subscriptions"} unwrapped
    platform_source_id_format_status: int  # a "+" in a platform source_id: 422 (stock) / 404


STOCK = Profile(
    name="stock",
    header_prefix="Chatwoot",
    event_status=False,
    event_message_type="name",
    event_created_at="iso",
    event_sender="stock",
    escape_html_in_json=True,
    webhook_retries=0,
    contact_search_per_minute=100,
    validation_error_key="message",
    duplicate_contact_status=422,
    duplicate_webhook_url_refused=True,
    no_access_status=401,
    missing_token_body="devise",
    current_page="int_then_string",
    flat_webhook_body=True,
    platform_source_id_format_status=422,
)

CONTRACT = Profile(
    name="contract",
    header_prefix="Service",
    event_status=True,
    event_message_type="number",
    event_created_at="unix",
    event_sender="contract",
    escape_html_in_json=False,
    webhook_retries=2,
    contact_search_per_minute=0,
    validation_error_key="error",
    duplicate_contact_status=400,
    duplicate_webhook_url_refused=False,
    no_access_status=403,
    missing_token_body="error",
    current_page="int",
    flat_webhook_body=False,
    platform_source_id_format_status=404,
)

PROFILES: dict[ProfileName, Profile] = {"stock": STOCK, "contract": CONTRACT}
