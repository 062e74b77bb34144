"""When each unconfirmed attempt is read back next (reconciliation backs off, and stops).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 14:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('next_read_at', UTC_DATETIME, nullable=True))
        batch_op.create_index(batch_op.f('ix_attempts_next_read_at'), ['next_read_at'], unique=False)
    # Attempts waiting for news keep being read back, from their last news on.
    op.execute("UPDATE attempts SET next_read_at = status_at WHERE state IN ('accepted', 'sent') AND message_id IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_attempts_next_read_at'))
        batch_op.drop_column('next_read_at')
