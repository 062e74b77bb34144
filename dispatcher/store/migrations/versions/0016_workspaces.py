"""Several workspaces (issue 15): each notification, webhook delivery and callback names its
workspace. Existing rows are the default workspace's, which today's single-workspace settings are.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26 15:05:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ('notifications', 'webhook_deliveries', 'callbacks'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('workspace', sa.String(length=64), nullable=False, server_default='default'))
    op.create_index('ix_notifications_workspace', 'notifications', ['workspace'])


def downgrade() -> None:
    op.drop_index('ix_notifications_workspace', table_name='notifications')
    for table in ('callbacks', 'webhook_deliveries', 'notifications'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('workspace')
