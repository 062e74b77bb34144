"""The first schema: notifications, attempts, payloads and the reuse caches.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22 15:19:05.406993
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('contact_inboxes',
    sa.Column('account_id', sa.BigInteger(), nullable=False),
    sa.Column('contact_id', sa.BigInteger(), nullable=False),
    sa.Column('inbox_id', sa.BigInteger(), nullable=False),
    sa.Column('source_id', sa.String(length=255), nullable=False),
    sa.PrimaryKeyConstraint('account_id', 'contact_id', 'inbox_id', name=op.f('pk_contact_inboxes'))
    )
    op.create_table('conversation_links',
    sa.Column('account_id', sa.BigInteger(), nullable=False),
    sa.Column('contact_id', sa.BigInteger(), nullable=False),
    sa.Column('inbox_id', sa.BigInteger(), nullable=False),
    sa.Column('conversation_id', sa.BigInteger(), nullable=True),
    sa.Column('claimed_until', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('account_id', 'contact_id', 'inbox_id', name=op.f('pk_conversation_links'))
    )
    op.create_table('known_contacts',
    sa.Column('account_id', sa.BigInteger(), nullable=False),
    sa.Column('identity_key', sa.String(length=64), nullable=False),
    sa.Column('contact_id', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('account_id', 'identity_key', name=op.f('pk_known_contacts'))
    )
    op.create_table('notifications',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('event_id', sa.String(length=200), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('route', sa.String(length=64), nullable=False),
    sa.Column('fallback_route', sa.String(length=64), nullable=True),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('send_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('next_try_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('channel', sa.String(length=20), nullable=True),
    sa.Column('inbox_id', sa.BigInteger(), nullable=True),
    sa.Column('message_id', sa.BigInteger(), nullable=True),
    sa.Column('conversation_id', sa.BigInteger(), nullable=True),
    sa.Column('accepted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('delivery_state', sa.String(length=20), nullable=True),
    sa.Column('error_kind', sa.String(length=40), nullable=True),
    sa.Column('error_detail', sa.String(length=200), nullable=True),
    sa.Column('fallback_decision', sa.String(length=10), nullable=True),
    sa.Column('fallback_reason', sa.String(length=200), nullable=True),
    sa.Column('fallback_decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_notifications')),
    sa.UniqueConstraint('event_id', name=op.f('uq_notifications_event_id'))
    )
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_notifications_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_notifications_next_try_at'), ['next_try_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_notifications_send_at'), ['send_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_notifications_state'), ['state'], unique=False)

    op.create_table('service_windows',
    sa.Column('account_id', sa.BigInteger(), nullable=False),
    sa.Column('contact_id', sa.BigInteger(), nullable=False),
    sa.Column('inbox_id', sa.BigInteger(), nullable=False),
    sa.Column('last_incoming_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('account_id', 'contact_id', 'inbox_id', name=op.f('pk_service_windows'))
    )
    op.create_table('attempts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('notification_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('number', sa.SmallInteger(), nullable=False),
    sa.Column('route', sa.String(length=64), nullable=False),
    sa.Column('channel', sa.String(length=20), nullable=False),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('inbox_id', sa.BigInteger(), nullable=True),
    sa.Column('contact_id', sa.BigInteger(), nullable=True),
    sa.Column('conversation_id', sa.BigInteger(), nullable=True),
    sa.Column('message_id', sa.BigInteger(), nullable=True),
    sa.Column('content_hash', sa.String(length=64), nullable=True),
    sa.Column('tries', sa.Integer(), nullable=False),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('in_flight_since', sa.DateTime(timezone=True), nullable=True),
    sa.Column('accepted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('status_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error_kind', sa.String(length=40), nullable=True),
    sa.Column('error_detail', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['notification_id'], ['notifications.id'], name=op.f('fk_attempts_notification_id_notifications'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_attempts')),
    sa.UniqueConstraint('message_id', name=op.f('uq_attempts_message_id')),
    sa.UniqueConstraint('notification_id', 'number', name=op.f('uq_attempts_notification_id'))
    )
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_attempts_notification_id'), ['notification_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_attempts_state'), ['state'], unique=False)

    op.create_table('payloads',
    sa.Column('notification_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('body', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['notification_id'], ['notifications.id'], name=op.f('fk_payloads_notification_id_notifications'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('notification_id', name=op.f('pk_payloads'))
    )


def downgrade() -> None:
    op.drop_table('payloads')
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_attempts_state'))
        batch_op.drop_index(batch_op.f('ix_attempts_notification_id'))

    op.drop_table('attempts')
    op.drop_table('service_windows')
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_notifications_state'))
        batch_op.drop_index(batch_op.f('ix_notifications_send_at'))
        batch_op.drop_index(batch_op.f('ix_notifications_next_try_at'))
        batch_op.drop_index(batch_op.f('ix_notifications_created_at'))

    op.drop_table('notifications')
    op.drop_table('known_contacts')
    op.drop_table('conversation_links')
    op.drop_table('contact_inboxes')
