"""Recipients decide (issue 19): suppressions, their audit trail, consent, and each
notification's category. Contacts can be found by their workspace ID, for an opt-out reply.

Existing notifications are of category ``service``, the default of every route.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 04:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.add_column(sa.Column('category', sa.String(length=64), nullable=False, server_default='service'))
    op.create_index('ix_known_contacts_contact_id', 'known_contacts', ['contact_id'])
    op.create_table(
        'suppressions',
        sa.Column('account_id', sa.BigInteger(), nullable=False),
        sa.Column('recipient_key', sa.String(length=64), nullable=False),
        sa.Column('channel', sa.String(length=20), nullable=False),
        sa.Column('category', sa.String(length=64), nullable=False),
        sa.Column('reason', sa.String(length=20), nullable=False),
        sa.Column('since', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('account_id', 'recipient_key', 'channel', 'category', name='pk_suppressions'),
    )
    op.create_table(
        'suppression_changes',
        sa.Column('id', ID, autoincrement=True, nullable=False),
        sa.Column('account_id', sa.BigInteger(), nullable=False),
        sa.Column('recipient_key', sa.String(length=64), nullable=False),
        sa.Column('channel', sa.String(length=20), nullable=False),
        sa.Column('category', sa.String(length=64), nullable=False),
        sa.Column('action', sa.String(length=20), nullable=False),
        sa.Column('reason', sa.String(length=20), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id', name='pk_suppression_changes'),
    )
    op.create_index('ix_suppression_changes_recipient_key', 'suppression_changes', ['recipient_key'])
    op.create_table(
        'consents',
        sa.Column('account_id', sa.BigInteger(), nullable=False),
        sa.Column('recipient_key', sa.String(length=64), nullable=False),
        sa.Column('channel', sa.String(length=20), nullable=False),
        sa.Column('reference', sa.String(length=100), nullable=False),
        sa.Column('granted_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('account_id', 'recipient_key', 'channel', name='pk_consents'),
    )


def downgrade() -> None:
    op.drop_table('consents')
    op.drop_index('ix_suppression_changes_recipient_key', table_name='suppression_changes')
    op.drop_table('suppression_changes')
    op.drop_table('suppressions')
    op.drop_index('ix_known_contacts_contact_id', table_name='known_contacts')
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_column('category')
