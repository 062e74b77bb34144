"""Webhook deliveries, recorded before processing, and the (message, status) pairs applied.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 15:42:31.353499
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('applied_statuses',
    sa.Column('message_id', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('applied_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('message_id', 'status', name=op.f('pk_applied_statuses'))
    )
    op.create_table('webhook_deliveries',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('delivery_id', sa.String(length=200), nullable=False),
    sa.Column('event', sa.String(length=40), nullable=False),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('processed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('outcome', sa.String(length=40), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_deliveries')),
    sa.UniqueConstraint('delivery_id', name=op.f('uq_webhook_deliveries_delivery_id'))
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_processed_at'), ['processed_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_received_at'), ['received_at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_received_at'))
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_processed_at'))

    op.drop_table('webhook_deliveries')
    op.drop_table('applied_statuses')
