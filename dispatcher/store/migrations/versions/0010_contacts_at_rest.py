"""Contact identities at rest: keyed hashes, and no source_id kept once its conversation exists.

``known_contacts`` held an unsalted SHA-256 of each identifier and phone number, which anyone can
enumerate back to the number; its keys are now HMAC-SHA256 with the settings' hashing key. The old
rows cannot be converted without the numbers, so they are dropped: each contact is found again by
one search on its next send. ``contact_inboxes.source_id`` kept phone numbers and e-mail addresses
in clear; a pair whose conversation is known no longer needs it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 18:15:00
"""

from __future__ import annotations

from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM known_contacts")
    op.execute(
        "UPDATE contact_inboxes SET source_id = '-' WHERE EXISTS ("
        " SELECT 1 FROM conversation_links AS link"
        " WHERE link.account_id = contact_inboxes.account_id AND link.contact_id = contact_inboxes.contact_id"
        " AND link.inbox_id = contact_inboxes.inbox_id AND link.conversation_id IS NOT NULL)"
    )


def downgrade() -> None:
    pass  # the forgotten values cannot come back; the caches fill again by themselves
