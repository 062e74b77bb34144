"""How many times an attempt was claimed for a createMessage call.

A claim is a compare-and-set on this count as the claiming worker read it, so a worker that read
the attempt before another worker's claim (and so did not look for that worker's message) can
no longer claim it: under a burst of redeliveries two workers looked, found nothing, and one of
them claimed after the other's ambiguous call had sent the message.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 17:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('claims', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_column('claims')
