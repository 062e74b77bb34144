"""Signed webhook deliveries.

Modules: ``verify`` (the check), ``events`` (what a payload says, without personal data),
``deliveries`` (record once by delivery ID, publish the row ID), ``receiver`` (the Starlette app,
``create_receiver_app``; imported from its module so readers of ``events`` need no web stack).
"""

from dispatcher.tracking.webhooks.events import EventSummary, summarize
from dispatcher.tracking.webhooks.verify import VerifiedDelivery, verify_delivery

__all__ = ["EventSummary", "VerifiedDelivery", "summarize", "verify_delivery"]
