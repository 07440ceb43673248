"""This thread's own transaction on the SQLite file a store call writes (``transaction.atomic()``
in the calling code): found, and its write lock told apart from another process's
(docs/ref/stores/database.rst, "Locks inside transaction.atomic() on SQLite")."""

from __future__ import annotations

import os
from typing import Any

from django.db import connections

from django_locks.exceptions import OwnTransactionError, StoreError

OWN_LOCK_WAIT = 0.05
"""Seconds a write of the store waits for SQLite's write lock while this thread's own transaction
on the same file is open (it may hold that lock: waiting longer cannot help); 0 when the
transaction certainly holds it (``transaction_mode`` IMMEDIATE or EXCLUSIVE)."""


def transaction_mode(settings_dict: dict[str, Any]) -> str | None:
    """The ``transaction_mode`` an alias's settings give (upper-cased, as Django takes it),
    read from the settings: the connection's attribute exists only once it connected."""
    mode = settings_dict.get("OPTIONS", {}).get("transaction_mode")
    return mode.upper() if isinstance(mode, str) else None


class OwnTransaction:
    """This thread's open transaction on the SQLite file a store call is about to write."""

    def __init__(self, wrapper: Any, *, testcase: bool, certain: bool) -> None:
        self.wrapper = wrapper
        self.testcase = testcase  # a TestCase's: the store writes through its connection
        self.certain = certain  # it holds the write lock for sure (IMMEDIATE or EXCLUSIVE)

    @property
    def busy_wait(self) -> float:
        """How long the store's write may wait for the write lock this transaction may hold."""
        return 0.0 if self.certain else OWN_LOCK_WAIT

    def refusal(self, using: str, exc: BaseException) -> StoreError | None:
        """The error to raise for ``exc`` when it is the write lock this transaction holds."""
        if not _busy(exc):
            return None
        alias = self.wrapper.alias
        how = (
            f"holds it since it began (transaction_mode {self.wrapper.transaction_mode})"
            if self.certain
            else "holds it (it wrote, or, in SQLite's rollback-journal mode, it read)"
        )
        same = f"alias {alias!r}" if alias == using else f"alias {alias!r}, the same file"
        return OwnTransactionError(
            f"The lock store cannot write to the SQLite database {using!r}: this thread is "
            f"inside transaction.atomic() on {same}, whose open transaction {how}; the store's "
            "own connection would wait on it until the call's timeout. Take the lock before "
            "entering transaction.atomic() (or outside it); under ATOMIC_REQUESTS, decorate the "
            "view with @transaction.non_atomic_requests and take the lock before the atomic "
            "block; or use PostgreSQL or Redis for locks."
        )


def testcase_open(wrapper: Any) -> bool:
    """Whether ``wrapper``'s outermost open atomic block is a TestCase's."""
    blocks = wrapper.atomic_blocks
    return bool(wrapper.in_atomic_block and blocks and getattr(blocks[0], "_from_testcase", False))


def open_transaction(using: str) -> OwnTransaction | None:
    """This thread's open transaction on the SQLite file of ``using`` (through any alias)."""
    target = _sqlite_file(connections[using].settings_dict["NAME"])
    for wrapper in connections.all(initialized_only=True):
        if (
            wrapper.vendor != "sqlite"
            or wrapper.connection is None
            or not wrapper.in_atomic_block
            or _sqlite_file(wrapper.settings_dict["NAME"]) != target
        ):
            continue
        if testcase_open(wrapper):
            return OwnTransaction(wrapper, testcase=True, certain=False)
        if wrapper.connection.in_transaction:
            mode = getattr(wrapper, "transaction_mode", None)
            return OwnTransaction(
                wrapper, testcase=False, certain=mode in ("IMMEDIATE", "EXCLUSIVE")
            )
    return None


def _sqlite_file(name: object) -> str:
    return os.path.realpath(os.fspath(name)) if isinstance(name, str | os.PathLike) else ""


def _busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (SQLITE_BUSY), however wrapped."""
    for error in (exc, exc.__cause__):
        code = getattr(error, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == 5:  # SQLITE_BUSY and its extended codes
            return True
        if error is not None and "database is locked" in str(error):
            return True
    return False
