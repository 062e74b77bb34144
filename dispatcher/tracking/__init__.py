"""Tracking: what became of each message, from webhooks and from reading back.

``webhooks`` receives and verifies signed deliveries and queues them; ``outcomes`` applies them (and makes
the single fallback decision); ``reconcile`` reads back what no webhook told and enforces the deadlines.
"""
