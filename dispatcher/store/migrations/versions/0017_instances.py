"""Workspaces on separate instances (issue 15): each instance numbers its accounts, contacts and
messages from 1, so an account's rows name its instance and a message ID is one workspace's.

``instance`` is "default" (the top-level api_url's instance) on every existing row: before this
revision every workspace was an account of that instance. An attempt's and an applied status's
workspace is its notification's. The downgrade refuses while rows of another instance exist.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26 16:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

# The tables keyed by account, with the rest of their primary key.
ACCOUNT_KEYED = {
    'known_contacts': ['identity_key'],
    'contact_inboxes': ['contact_id', 'inbox_id'],
    'conversation_links': ['contact_id', 'inbox_id'],
    'service_windows': ['contact_id', 'inbox_id'],
    'suppressions': ['recipient_key', 'channel', 'category'],
    'consents': ['recipient_key', 'channel'],
}


def _column(name: str) -> sa.Column[str]:
    return sa.Column(name, sa.String(length=64), nullable=False, server_default='default')


def upgrade() -> None:
    for table, rest in ACCOUNT_KEYED.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(_column('instance'))
            batch_op.drop_constraint(f'pk_{table}', type_='primary')
            batch_op.create_primary_key(f'pk_{table}', ['instance', 'account_id', *rest])
    with op.batch_alter_table('suppression_changes', schema=None) as batch_op:
        batch_op.add_column(_column('instance'))
    with op.batch_alter_table('applied_statuses', schema=None) as batch_op:
        batch_op.add_column(_column('workspace'))
        batch_op.drop_constraint('pk_applied_statuses', type_='primary')
        batch_op.create_primary_key('pk_applied_statuses', ['workspace', 'message_id', 'status'])
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.add_column(_column('workspace'))
    op.execute("UPDATE attempts SET workspace = (SELECT notifications.workspace FROM notifications "
               "WHERE notifications.id = attempts.notification_id)")
    op.execute("UPDATE applied_statuses SET workspace = COALESCE((SELECT notifications.workspace FROM attempts "
               "JOIN notifications ON notifications.id = attempts.notification_id "
               "WHERE attempts.message_id = applied_statuses.message_id), 'default')")
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_constraint('uq_attempts_message_id', type_='unique')
        batch_op.create_unique_constraint('uq_attempts_workspace_message', ['workspace', 'message_id'])


def downgrade() -> None:
    # The old keys cannot hold two instances' rows (the same account, contact or message ID twice):
    # refuse, saying why, rather than fail half-way on a duplicate key.
    bind = op.get_bind()
    others = sum(bind.execute(sa.text(f"SELECT COUNT(*) FROM {table} WHERE instance <> 'default'")).scalar_one()
                 for table in ACCOUNT_KEYED)
    shared_ids = bind.execute(sa.text("SELECT COUNT(*) FROM (SELECT message_id FROM attempts WHERE message_id IS NOT "
                                      "NULL GROUP BY message_id HAVING COUNT(*) > 1) AS twice")).scalar_one()
    if others or shared_ids:
        raise RuntimeError("revision 0017 cannot be undone while the store holds rows of workspaces on separate "
                           "instances: the older keys cannot tell them apart")
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_constraint('uq_attempts_workspace_message', type_='unique')
        batch_op.create_unique_constraint('uq_attempts_message_id', ['message_id'])
        batch_op.drop_column('workspace')
    with op.batch_alter_table('applied_statuses', schema=None) as batch_op:
        batch_op.drop_constraint('pk_applied_statuses', type_='primary')
        batch_op.create_primary_key('pk_applied_statuses', ['message_id', 'status'])
        batch_op.drop_column('workspace')
    with op.batch_alter_table('suppression_changes', schema=None) as batch_op:
        batch_op.drop_column('instance')
    for table, rest in ACCOUNT_KEYED.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(f'pk_{table}', type_='primary')
            batch_op.create_primary_key(f'pk_{table}', ['account_id', *rest])
            batch_op.drop_column('instance')
