"""Two budgets for an attempt (issue 22): ``tries`` counts only calls that reached the workspace and
failed; ``runs`` counts the send task's runs that started and never finished (a crash, a killed
worker), the crash guard, set aside as ``crash_loop`` past ``send_max_runs``.

Before this, every run counted a try, so redeliveries after crashes ended notifications
``tries_exhausted`` without a message. Attempts in progress keep their ``tries`` as counted then.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 08:15:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('runs', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('runs')
