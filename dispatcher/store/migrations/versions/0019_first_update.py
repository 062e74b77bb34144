"""Tracking (issue 44): the keyed digest of the first update an attempt's message was reported
with, so that a second, different update without an error tells the consumer the message moved
past ``sent`` although a late ``sent`` overwrote the workspace's status (docs/tracking.md).

Existing attempts keep NULL: their next update is taken as their first.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('first_update_digest', sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('first_update_digest')
