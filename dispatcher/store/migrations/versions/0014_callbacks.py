"""Outcome callbacks to the host (issue 15): the outbox of events to deliver, and the endpoints
paused because they keep failing.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 14:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table(
        'callbacks',
        sa.Column('id', ID, autoincrement=True, nullable=False),
        sa.Column('notification_id', sa.BigInteger(), nullable=False),
        sa.Column('event_id', sa.String(length=200), nullable=False),
        sa.Column('route', sa.String(length=64), nullable=False),
        sa.Column('type', sa.String(length=40), nullable=False),
        sa.Column('attempt', sa.SmallInteger(), nullable=False),
        sa.Column('state', sa.String(length=20), nullable=False),
        sa.Column('channel', sa.String(length=20), nullable=True),
        sa.Column('error_kind', sa.String(length=40), nullable=True),
        sa.Column('sequence', sa.Integer(), nullable=False),
        sa.Column('occurred_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('status', sa.String(length=12), nullable=False),
        sa.Column('tries', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('next_try_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_error', sa.String(length=200), nullable=True),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id', name='pk_callbacks'),
        sa.UniqueConstraint('notification_id', 'type', 'attempt', name='uq_callbacks_notification_id'),
    )
    op.create_index('ix_callbacks_notification_id', 'callbacks', ['notification_id'])
    op.create_index('ix_callbacks_status', 'callbacks', ['status'])
    op.create_index('ix_callbacks_next_try_at', 'callbacks', ['next_try_at'])
    op.create_table(
        'callback_endpoints',
        sa.Column('url_key', sa.String(length=64), nullable=False),
        sa.Column('failing_since', sa.DateTime(timezone=True), nullable=True),
        sa.Column('paused_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('reason', sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint('url_key', name='pk_callback_endpoints'),
    )


def downgrade() -> None:
    op.drop_table('callback_endpoints')
    op.drop_index('ix_callbacks_next_try_at', table_name='callbacks')
    op.drop_index('ix_callbacks_status', table_name='callbacks')
    op.drop_index('ix_callbacks_notification_id', table_name='callbacks')
    op.drop_table('callbacks')
