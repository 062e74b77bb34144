"""When the tracking sweep last published a recorded webhook delivery again.

The sweep used to publish every unprocessed delivery on every pass: with the consumer down for
100 s, 4,490 messages were queued for 100 deliveries. Now a delivery is published again at most
once per grace period (30 s), counted from its receipt or its last republication.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 18:05:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('republished_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_column('republished_at')
