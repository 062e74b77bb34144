"""How many times the consumer tried a webhook delivery, and its last error (set aside past a bound).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 15:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tries', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('last_error', sa.String(length=80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_column('last_error')
        batch_op.drop_column('tries')
