"""The database store's SQLite dialect: its SQL, its transactions, and this thread's own one."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections

from django_locks.exceptions import OwnTransactionError, StoreError
from django_locks.stores.database.operations import (
    MIGRATED,
    RECORDER,
    SEQUENCE,
    TABLE,
    LeaseRow,
    Operations,
)

if TYPE_CHECKING:
    from django_locks.stores.database.connections import StoreConnection

T = TypeVar("T")

OWN_LOCK_WAIT = 0.05
"""Seconds a write of the store waits for SQLite's write lock while this thread's own transaction
on the same file is open (it may hold that lock: waiting longer cannot help); 0 when the
transaction certainly holds it (``transaction_mode`` IMMEDIATE or EXCLUSIVE)."""

# Every write runs inside BEGIN IMMEDIATE (the database's write lock, taken up front so that
# concurrent writers wait for it instead of failing to upgrade a read lock), which makes the few
# statements below one atomic step. Times are Django's text format, from SQLite's 'now' (the
# machine's clock: one machine only), compared through julianday(). The token floor is the
# one-row table holding the highest token ever handed out, so a pruned row's key never goes back.
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
_EXPIRY = "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)"
_LIVE = "released_at IS NULL AND julianday(expires_at) > julianday('now')"
SQLITE_ACQUIRE = f"""
INSERT INTO {TABLE} (key, owner, holder, fencing_token, acquired_at, expires_at, released_at)
VALUES (?, ?, ?, (SELECT value + 1 FROM {SEQUENCE} WHERE id = 1), {_NOW}, {_EXPIRY},
    NULL)
ON CONFLICT (key) DO UPDATE SET
    fencing_token = CASE WHEN owner = excluded.owner AND {_LIVE}
        THEN fencing_token ELSE max(fencing_token + 1, excluded.fencing_token) END,
    acquired_at = CASE WHEN owner = excluded.owner AND {_LIVE}
        THEN acquired_at ELSE excluded.acquired_at END,
    owner = excluded.owner,
    holder = excluded.holder,
    expires_at = excluded.expires_at,
    released_at = NULL
WHERE owner = excluded.owner OR NOT ({_LIVE})
"""
SQLITE_TOKEN = f"SELECT fencing_token FROM {TABLE} WHERE key = ?"
SQLITE_RAISE_FLOOR = f"UPDATE {SEQUENCE} SET value = max(value, ?) WHERE id = 1"
SQLITE_RENEW = f"""
UPDATE {TABLE} SET expires_at = {_EXPIRY} WHERE key = ? AND owner = ? AND {_LIVE}
"""
_FREE = f"""
UPDATE {TABLE} SET released_at = {_NOW},
    expires_at = CASE WHEN julianday(expires_at) > julianday('now') THEN {_NOW}
        ELSE expires_at END
WHERE {_LIVE}"""
SQLITE_RELEASE = _FREE + " AND key = ? AND owner = ?"
SQLITE_FORCE_RELEASE = _FREE + " AND key = ?"
SQLITE_CLEAR = _FREE
SQLITE_WARP = f"""
UPDATE {TABLE} SET expires_at = strftime('%Y-%m-%d %H:%M:%f', expires_at, ?) WHERE {_LIVE}"""
SQLITE_LEASES = f"""
SELECT key, owner, holder, fencing_token, acquired_at,
    CASE WHEN released_at IS NOT NULL THEN 'released'
         WHEN julianday(expires_at) > julianday('now') THEN 'held' ELSE 'expired' END,
    CAST(round((julianday(expires_at) - julianday('now')) * 86400000) AS integer)
FROM {TABLE}
"""
SQLITE_LEASES_HELD = SQLITE_LEASES + f" WHERE {_LIVE}"
SQLITE_LEASE = SQLITE_LEASES + " WHERE key = ?"
SQLITE_LEASE_HELD = SQLITE_LEASE + f" AND {_LIVE}"
# Pruning: the counter already holds the highest token ever handed out (every acquire raises
# it); raising it again costs nothing and keeps the rule local. The transaction's first write
# takes the database's write lock, which keeps the store's writers out until the rows are gone.
_STALE = "julianday(expires_at) < julianday('now', ?)"
SQLITE_PRUNE_FLOOR = f"""
UPDATE {SEQUENCE} SET value = max(value, coalesce(
    (SELECT max(fencing_token) FROM {TABLE} WHERE {_STALE}), 0)) WHERE id = 1
"""
SQLITE_PRUNE_DELETE = f"DELETE FROM {TABLE} WHERE {_STALE}"
SQLITE_PRUNE_COUNT = f"SELECT count(*) FROM {TABLE} WHERE {_STALE}"
SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?)"


def _offset(ms: int) -> str:
    return f"+{ms / 1000:.3f} seconds"


class SQLiteOperations(Operations):
    """SQLite: each write one ``BEGIN IMMEDIATE`` transaction (a savepoint inside Django's)."""

    vendor = "sqlite"
    recreate_sequence = (
        f"CREATE TABLE {SEQUENCE} (id integer NOT NULL PRIMARY KEY CHECK (id = 1), "
        f"value integer NOT NULL); INSERT INTO {SEQUENCE} VALUES (1, (SELECT "
        f"coalesce(max(fencing_token), 0) FROM {TABLE}));"
    )

    def run(
        self,
        conn: StoreConnection,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        deadline: float,
        write: bool,
        busy_wait: float | None,
    ) -> T:
        raw = conn.raw
        cursor = raw.cursor()
        try:
            if conn.owned:
                # Waiting for another process's write lock counts against the call's timeout;
                # with this thread's own transaction open on the file, only ``busy_wait``.
                left = deadline - time.monotonic()
                if busy_wait is None:
                    ms = max(1, math.ceil(left * 1000))
                else:
                    ms = max(0, math.ceil(min(left, busy_wait) * 1000))
                cursor.execute(f"PRAGMA busy_timeout = {ms}")
            if not write:
                return fn(cursor, *args)
            # BEGIN IMMEDIATE takes the write lock up front; inside a transaction of Django's
            # own (the in-memory test database) a savepoint makes the statements one step.
            nested = raw.in_transaction
            cursor.execute("SAVEPOINT django_locks" if nested else "BEGIN IMMEDIATE")
            try:
                result = fn(cursor, *args)
            except BaseException:
                try:
                    cursor.execute("ROLLBACK TO django_locks" if nested else "ROLLBACK")
                    if nested:
                        cursor.execute("RELEASE django_locks")
                except Exception:
                    pass
                raise
            cursor.execute("RELEASE django_locks" if nested else "COMMIT")
            return result
        finally:
            cursor.close()

    def in_memory(self) -> bool:
        wrapper: Any = connections[self.using]
        return bool(wrapper.is_in_memory_db())

    def own_transaction(self, *, renewal: bool, write: bool) -> OwnTransaction | None:
        if self.in_memory():
            return None
        own = _own_transaction(self.using)
        if own is not None and not own.testcase and (renewal or not write):
            return None  # the renewer is never refused: a busy file is an error it retries
        return own

    def missing_table(self, exc: BaseException) -> bool:
        return "no such table: django_locks_" in str(exc)

    def acquire(self, cursor: Any, key: str, owner: str, holder: str, ttl_ms: int) -> int | None:
        cursor.execute(SQLITE_ACQUIRE, (key, owner, holder, _offset(ttl_ms)))
        if cursor.rowcount != 1:
            return None
        token = int(cursor.execute(SQLITE_TOKEN, (key,)).fetchone()[0])
        cursor.execute(SQLITE_RAISE_FLOOR, (token,))
        return token

    def renew(self, cursor: Any, key: str, owner: str, ttl_ms: int) -> bool:
        cursor.execute(SQLITE_RENEW, (_offset(ttl_ms), key, owner))
        return bool(cursor.rowcount == 1)

    def renew_many(
        self, cursor: Any, leases: Sequence[tuple[str, str, int]]
    ) -> set[tuple[str, str]]:
        renewed = set()
        for key, owner, ttl_ms in leases:  # one transaction (BEGIN IMMEDIATE): one step
            cursor.execute(SQLITE_RENEW, (_offset(ttl_ms), key, owner))
            if cursor.rowcount == 1:
                renewed.add((key, owner))
        return renewed

    def release(self, cursor: Any, key: str, owner: str) -> bool:
        cursor.execute(SQLITE_RELEASE, (key, owner))
        return bool(cursor.rowcount == 1)

    def force_release(self, cursor: Any, key: str) -> int:
        cursor.execute(SQLITE_FORCE_RELEASE, (key,))
        return int(cursor.rowcount)

    def clear(self, cursor: Any) -> int:
        cursor.execute(SQLITE_CLEAR)
        return int(cursor.rowcount)

    def warp(self, cursor: Any, delta_ms: int) -> None:
        cursor.execute(SQLITE_WARP, (f"-{delta_ms / 1000:.3f} seconds",))

    def leases(self, cursor: Any, include_inactive: bool) -> list[LeaseRow]:
        return list(cursor.execute(SQLITE_LEASES if include_inactive else SQLITE_LEASES_HELD))

    def lease(self, cursor: Any, key: str, include_inactive: bool) -> LeaseRow | None:
        row = cursor.execute(SQLITE_LEASE if include_inactive else SQLITE_LEASE_HELD, (key,))
        found = row.fetchone()
        return None if found is None else tuple(found)

    def prune(self, cursor: Any, older_than_ms: int, limit: int) -> tuple[int, bool]:
        # All at once, in the one transaction run() opened: SQLite has one machine's worth of
        # rows, and the write lock is taken by the floor's raise, before the delete.
        offset = f"-{older_than_ms / 1000:.3f} seconds"
        cursor.execute(SQLITE_PRUNE_FLOOR, (offset,))
        cursor.execute(SQLITE_PRUNE_DELETE, (offset,))
        return int(cursor.rowcount), False

    def count_prunable(self, cursor: Any, older_than_ms: int) -> int:
        offset = f"-{older_than_ms / 1000:.3f} seconds"
        return int(cursor.execute(SQLITE_PRUNE_COUNT, (offset,)).fetchone()[0])

    def missing_schema(self, cursor: Any) -> list[str]:
        found = {row[0] for row in cursor.execute(SQLITE_TABLES, (TABLE, SEQUENCE, RECORDER))}
        missing = [name for name in (TABLE, SEQUENCE) if name not in found]
        if not missing or RECORDER not in found:
            return []
        return missing if cursor.execute(MIGRATED).fetchone() else []


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


def _own_transaction(using: str) -> OwnTransaction | None:
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
