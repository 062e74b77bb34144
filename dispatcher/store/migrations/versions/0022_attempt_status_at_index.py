"""An index on ``attempts.status_at``, for the dashboard's trends of the last hour (issue 47,
docs/dashboard.md): the messages accepted and the notifications settled in the hour are found by
it, not by a scan of every attempt.

``status_at`` is written only with ``state`` (an acceptance, a delivery status, a failure), which is
indexed already. On PostgreSQL a new attempt, and an update that changes the state (never a HOT
update), write one index entry more; the updates that leave the state (a try counted) stay HOT.
Building it reads every attempt once and holds writes to the table meanwhile.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 10:00:00
"""

from __future__ import annotations

from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_attempts_status_at'), ['status_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_attempts_status_at'))
