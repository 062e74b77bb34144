"""Operators (issue 16): a notification's W3C traceparent, so every process that works on it
continues its one trace (random IDs only; NULL while tracing is off); the message a webhook
delivery is about, as an indexed column, so one notification's page finds its webhooks; and the
indexes the operators' filters and counts use (error kind, route, set-aside deliveries).

Existing deliveries keep a NULL message_id: their summaries still hold it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26 16:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trace_parent', sa.String(length=64), nullable=True))
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('message_id', sa.BigInteger(), nullable=True))
    op.create_index('ix_notifications_error_kind', 'notifications', ['error_kind'])
    op.create_index('ix_notifications_route', 'notifications', ['route', 'id'])
    op.create_index('ix_webhook_deliveries_message', 'webhook_deliveries', ['workspace', 'message_id'])
    op.create_index('ix_webhook_deliveries_outcome', 'webhook_deliveries', ['outcome'])


def downgrade() -> None:
    op.drop_index('ix_webhook_deliveries_outcome', table_name='webhook_deliveries')
    op.drop_index('ix_webhook_deliveries_message', table_name='webhook_deliveries')
    op.drop_index('ix_notifications_route', table_name='notifications')
    op.drop_index('ix_notifications_error_kind', table_name='notifications')
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_column('message_id')
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_column('trace_parent')
