"""Which attempt is the notification's current one, and what each attempt is for.

A notification may now have a third attempt: the first send, a resend as the approved template on
the same route after 131047 (the customer-service window was closed), and the single fallback.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 15:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.add_column(sa.Column('current_attempt', sa.SmallInteger(), nullable=False, server_default='1'))
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('purpose', sa.String(length=12), nullable=False, server_default='first'))
    op.execute("UPDATE notifications SET current_attempt = 2 WHERE fallback_decision = 'fallback'")
    op.execute("UPDATE attempts SET purpose = 'fallback' WHERE number = 2")


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('purpose')
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_column('current_attempt')
