"""A notification's callbacks are numbered once each: a unique (notification_id, sequence).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 14:50:00
"""

from __future__ import annotations

from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('callbacks', schema=None) as batch_op:
        batch_op.create_unique_constraint('uq_callbacks_sequence', ['notification_id', 'sequence'])


def downgrade() -> None:
    with op.batch_alter_table('callbacks', schema=None) as batch_op:
        batch_op.drop_constraint('uq_callbacks_sequence', type_='unique')
