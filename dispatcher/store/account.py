"""Whose contacts, conversations, service windows, opt-outs and consents a row of the store is.

An account ID alone does not say: workspaces on separate instances (docs/workspaces.md) each
number their accounts, and their contacts, from 1. So every such row also names the account's
instance: ``default`` for the instance at the top-level ``api_url`` (every row written before
workspaces existed is one of these), else the name of the workspace whose instance it is. A
workspace on the top-level instance can be renamed without losing its opt-outs; one on an
instance of its own keeps them under its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_

TOP_LEVEL_INSTANCE = "default"


@dataclass(frozen=True)
class Account:
    instance: str
    id: int

    @property
    def columns(self) -> dict[str, Any]:
        """The row's account columns, for an insert."""
        return {"instance": self.instance, "account_id": self.id}


def of_account(columns: Any, account: Account) -> ColumnElement[bool]:
    """Rows of ``account``: ``columns`` is a Core table's ``.c`` or a mapped class."""
    return and_(columns.instance == account.instance, columns.account_id == account.id)
