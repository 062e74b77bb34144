"""Intake: a host hands over a business event (Python, HTTP, an outbox row); it is checked, stored once and queued.

``request`` is the request's shape, ``accept`` stores it under its event ID, ``http`` serves it over JSON,
``outbox`` stages it inside the host's own transaction.
"""
