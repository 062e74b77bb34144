"""Whether a notification's send task has started (issue 44, one task per waiting row).

The sweep used to publish a sendable row again whenever ``enqueued_at`` was older than
``stale_after_s``, whether its task still waited in the broker's queue or not: a backlog got
another task per row every 45 s (94,174 tasks for 5,000 notifications). ``task_started`` tells a
task published and still possibly queued (false: the sweep publishes it again only once the send
queue is empty) from one a run has touched (true: its lease lapses ``stale_after_s`` after the
touch). Rows already there read false: at worst a row a run holds now waits for an empty queue.

A boolean with a constant default: PostgreSQL 11+ adds it without rewriting the table, SQLite
with ALTER TABLE ADD COLUMN.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 09:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The default as a string ('0' reads false on PostgreSQL and SQLite alike), not an SQL
    # expression: with an expression Alembic rebuilds the table on SQLite (copy, drop, rename),
    # and dropping notifications there deletes every attempt through their ON DELETE CASCADE.
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.add_column(sa.Column('task_started', sa.Boolean(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_column('task_started')
