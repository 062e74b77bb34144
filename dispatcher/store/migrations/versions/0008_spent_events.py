"""Spent event IDs: retention keeps a keyed hash of each purged notification's event ID.

Retention now purges only settled notifications; a purged event ID stays spent for
``event_id_spent_days``, so a host that hands the same event over again is refused instead of
the reminder going out twice.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'spent_events',
        sa.Column('event_key', sa.String(length=64), nullable=False),
        sa.Column('spent_until', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('event_key'),
    )
    op.create_index('ix_spent_events_spent_until', 'spent_events', ['spent_until'])


def downgrade() -> None:
    op.drop_index('ix_spent_events_spent_until', table_name='spent_events')
    op.drop_table('spent_events')
