"""A notification's priority, ``urgent`` or ``normal`` (issue 45, docs/priorities.md).

Its send tasks go through its lane's queue, and its calls take the rate limits urgent first.
Rows already there are normal, as every notification was before.

A string with a constant default: PostgreSQL 11+ adds it without rewriting the table, SQLite with
ALTER TABLE ADD COLUMN (a string default: no batch rebuild, see 0020).

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 16:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.add_column(sa.Column('priority', sa.String(length=8), nullable=False, server_default='normal'))


def downgrade() -> None:
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_column('priority')
