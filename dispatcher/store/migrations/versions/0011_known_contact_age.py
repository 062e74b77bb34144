"""When each contact was first resolved, so retention can forget bindings no notification uses.

Rows that exist already count from now: they are forgotten one retention period later at the
earliest.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 18:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('known_contacts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('created_at', sa.DateTime(timezone=True), nullable=False,
                                      server_default=sa.func.now()))


def downgrade() -> None:
    with op.batch_alter_table('known_contacts', schema=None) as batch_op:
        batch_op.drop_column('created_at')
