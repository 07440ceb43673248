"""The database store's SQLite dialect (its SQL in ``sqlite_sql.py``): its steps and its
transactions (this thread's own one: ``sqlite_atomic.py``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections

from django_locks.exceptions import PermitsMismatchError
from django_locks.stores.base import (
    PERMITS_OWNER,
    PREEMPTED,
    LeaveReason,
    PermitGrant,
    ReleaseReason,
    Renewed,
    Slot,
)
from django_locks.stores.database.operations import (
    ADDED_COLUMNS,
    MIGRATED,
    RECORDER,
    SEQUENCE,
    TABLE,
    HolderRow,
    LeaseRow,
    Operations,
    schema_missing,
)
from django_locks.stores.database.sqlite_atomic import OwnTransaction, open_transaction
from django_locks.stores.database.sqlite_sql import (
    SQLITE_ACQUIRE_AS,
    SQLITE_CLEAR,
    SQLITE_CLEAR_TICKS,
    SQLITE_COLUMNS,
    SQLITE_END,
    SQLITE_FORCE_END,
    SQLITE_HOLDER,
    SQLITE_LEASE,
    SQLITE_LEASE_HELD,
    SQLITE_LEASES,
    SQLITE_LEASES_HELD,
    SQLITE_LEAVE,
    SQLITE_OLDEST_SLOT,
    SQLITE_PERMIT_BASE,
    SQLITE_PERMIT_EXTEND,
    SQLITE_PERMIT_FOLLOW,
    SQLITE_PERMIT_FORCE_SLOTS,
    SQLITE_PERMIT_FREE,
    SQLITE_PERMIT_LATEST,
    SQLITE_PERMIT_RECORD,
    SQLITE_PERMIT_SLOTS,
    SQLITE_PERMIT_TAKE,
    SQLITE_PREEMPT,
    SQLITE_PREEMPTED,
    SQLITE_PRUNE_COUNT,
    SQLITE_PRUNE_COUNT_PREFIXED,
    SQLITE_PRUNE_DELETE,
    SQLITE_PRUNE_DELETE_PREFIXED,
    SQLITE_PRUNE_FLOOR,
    SQLITE_RAISE_FLOOR,
    SQLITE_RECORD_TICK,
    SQLITE_RECORDED_TICK,
    SQLITE_RENEW,
    SQLITE_TABLES,
    SQLITE_TOKEN,
    SQLITE_WARP,
    numbered,
    offset,
)

if TYPE_CHECKING:
    from django_locks.stores.database.connections import StoreConnection

T = TypeVar("T")


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
        own = open_transaction(self.using)
        if own is not None and not own.testcase and (renewal or not write):
            return None  # the renewer is never refused: a busy file is an error it retries
        return own

    def missing_table(self, exc: BaseException) -> bool:
        return "no such table: django_locks_" in str(exc)

    def missing_column(self, exc: BaseException) -> bool:
        # "table ... has no column named holder_kind", "no such column: excluded.holder_kind"
        text = str(exc)
        return "column" in text and any(column in text for column in ADDED_COLUMNS)

    def acquire_as(
        self,
        cursor: Any,
        key: str,
        owner: str,
        holder: str,
        kind: str | None,
        detail: str | None,
        ttl_ms: int,
    ) -> int | HolderRow | None:
        cursor.execute(SQLITE_ACQUIRE_AS, (key, owner, holder, offset(ttl_ms), kind, detail))
        if cursor.rowcount != 1:
            # Refused by a live lease: the transaction's write lock keeps it as it is.
            found = cursor.execute(SQLITE_HOLDER, (key,)).fetchone()
            if found is None:
                return None
            *refuser, held_by, permits, base_key = found
            if base_key is not None or (held_by == PERMITS_OWNER and permits is not None):
                raise PermitsMismatchError(key, 1, int(permits or 1))
            return tuple(refuser)
        token = int(cursor.execute(SQLITE_TOKEN, (key,)).fetchone()[0])
        cursor.execute(SQLITE_RAISE_FLOOR, (token,))
        return token

    # Permits: a Slot key's operations move or end its key's own row in the same transaction.

    supports_permits = True

    def acquire_permit(
        self,
        cursor: Any,
        key: str,
        owner: str,
        holder: str,
        kind: str | None,
        detail: str | None,
        ttl_ms: int,
        permits: int,
    ) -> PermitGrant | HolderRow | None:
        found = cursor.execute(SQLITE_PERMIT_BASE, (key,)).fetchone()
        if found is not None and found[3]:
            held_by, held_permits, base_key, _ = found
            # A plain lease, or a slot of another key (one lease too), counts as permits=1.
            live = 1
            if held_by == PERMITS_OWNER and held_permits is not None and base_key is None:
                live = int(held_permits)
            if live != permits:
                raise PermitsMismatchError(key, permits, live)
        prefix = f"{key}#"
        taken: set[int] = set()
        first_to_end: HolderRow | None = None
        for slot, slot_owner, slot_base, token, *described in cursor.execute(
            SQLITE_PERMIT_SLOTS, numbered((prefix, f"{key}$"))
        ).fetchall():
            permit = _permit(slot, len(prefix), permits)
            if permit is None:
                continue  # another key's ("k#x"), or a slot past this permits value
            taken.add(permit)
            if slot_owner == owner and slot_base == key:
                cursor.execute(
                    SQLITE_PERMIT_EXTEND,
                    numbered((offset(ttl_ms), holder, kind, detail, slot, owner)),
                )
                _follow(cursor, key, slot)
                return PermitGrant(int(token), permit)
            if first_to_end is None:
                first_to_end = tuple(described)
        free = next((n for n in range(1, permits + 1) if n not in taken), None)
        if free is None:
            return first_to_end
        slot = f"{prefix}{free}"
        args = (slot, owner, holder, offset(ttl_ms), kind, detail, permits, key)
        cursor.execute(SQLITE_PERMIT_TAKE, numbered(args))
        token = int(cursor.execute(SQLITE_TOKEN, (slot,)).fetchone()[0])
        cursor.execute(SQLITE_PERMIT_RECORD, numbered((key, token, slot, permits, holder)))
        cursor.execute(SQLITE_RAISE_FLOOR, (token,))
        return PermitGrant(token, free)

    def renew(self, cursor: Any, key: str, owner: str, ttl_ms: int) -> Renewed:
        renewed = _renew(cursor, key, owner, ttl_ms)
        if renewed is True and isinstance(key, Slot):
            _follow(cursor, key.base, str(key))
        return renewed

    def renew_many(
        self, cursor: Any, leases: Sequence[tuple[str, str, int]]
    ) -> dict[tuple[str, str], Renewed]:
        answers: dict[tuple[str, str], Renewed] = {}
        bases: dict[str, None] = {}  # the keys of the slots renewed, in order
        for key, owner, ttl_ms in leases:  # one transaction (BEGIN IMMEDIATE): one step
            renewed = _renew(cursor, key, owner, ttl_ms)
            if renewed is not False:
                answers[key, owner] = renewed
                if renewed is True and isinstance(key, Slot):
                    bases[key.base] = None
        for base in bases:  # once per key, however many of its slots the batch renewed
            cursor.execute(SQLITE_PERMIT_LATEST, numbered((f"{base}#", f"{base}$", base)))
        return answers

    def preempt(self, cursor: Any, key: str) -> int | None:
        # One BEGIN IMMEDIATE transaction: nothing moves between the reads and the write.
        found = cursor.execute(SQLITE_PERMIT_BASE, (key,)).fetchone()
        if found is None or not found[3]:
            return None
        held_by, permits, base_key, _ = found
        if held_by == PERMITS_OWNER and permits is not None and base_key is None:
            oldest = cursor.execute(
                SQLITE_OLDEST_SLOT, numbered((f"{key}#", f"{key}$", key))
            ).fetchone()
            if oldest is None:
                return None
            key = oldest[0]
        cursor.execute(SQLITE_PREEMPT, (key,))
        return int(cursor.execute(SQLITE_TOKEN, (key,)).fetchone()[0])

    def record_tick(self, cursor: Any, key: str, owner: str, tick_ms: int) -> bool:
        cursor.execute(SQLITE_RECORD_TICK, (tick_ms, str(key), owner))
        return bool(cursor.rowcount == 1)

    def recorded_tick(self, cursor: Any, key: str) -> tuple[int, int] | None:
        row = cursor.execute(SQLITE_RECORDED_TICK, (str(key),)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def leave(self, cursor: Any, key: str, owner: str, ttl_ms: int, how: LeaveReason) -> bool:
        cursor.execute(SQLITE_LEAVE, (offset(ttl_ms), how, key, owner))
        left = bool(cursor.rowcount == 1)
        if left and isinstance(key, Slot):
            _follow(cursor, key.base, str(key))
        return left

    def end(self, cursor: Any, key: str, owner: str, how: ReleaseReason) -> bool:
        cursor.execute(SQLITE_END, (how, key, owner))
        ended = bool(cursor.rowcount == 1)
        if ended and isinstance(key, Slot):
            _follow_end(cursor, key.base, how, None)
        return ended

    def force_end(self, cursor: Any, key: str, by: str | None) -> int:
        found = cursor.execute(SQLITE_PERMIT_BASE, (key,)).fetchone()
        cursor.execute(SQLITE_FORCE_END, (by, key))
        freed = int(cursor.rowcount)
        if found is None:
            return freed
        held_by, permits, base_key, _ = found
        if held_by == PERMITS_OWNER and permits is not None and base_key is None:
            cursor.execute(SQLITE_PERMIT_FORCE_SLOTS, numbered((f"{key}#", f"{key}$", by, key)))
            return 1 if freed or cursor.rowcount else 0
        if freed and base_key is not None:
            _follow_end(cursor, base_key, "force released", by)
        return freed

    def clear(self, cursor: Any) -> int:
        cursor.execute(SQLITE_CLEAR)
        freed = int(cursor.rowcount)
        cursor.execute(SQLITE_CLEAR_TICKS)
        return freed

    def warp(self, cursor: Any, delta_ms: int) -> None:
        cursor.execute(SQLITE_WARP, (f"-{delta_ms / 1000:.3f} seconds",))

    def leases(self, cursor: Any, include_inactive: bool) -> list[LeaseRow]:
        return list(cursor.execute(SQLITE_LEASES if include_inactive else SQLITE_LEASES_HELD))

    def lease(self, cursor: Any, key: str, include_inactive: bool) -> LeaseRow | None:
        row = cursor.execute(SQLITE_LEASE if include_inactive else SQLITE_LEASE_HELD, (key,))
        found = row.fetchone()
        return None if found is None else tuple(found)

    def prune(
        self, cursor: Any, older_than_ms: int, limit: int, prefix: str = ""
    ) -> tuple[int, bool]:
        # All at once, in the one transaction run() opened: SQLite has one machine's worth of
        # rows, and the write lock is taken by the floor's raise, before the delete.
        ago = f"-{older_than_ms / 1000:.3f} seconds"
        cursor.execute(SQLITE_PRUNE_FLOOR, (ago,))
        if prefix:
            cursor.execute(SQLITE_PRUNE_DELETE_PREFIXED, (ago, len(prefix), prefix))
        else:
            cursor.execute(SQLITE_PRUNE_DELETE, (ago,))
        return int(cursor.rowcount), False

    def count_prunable(self, cursor: Any, older_than_ms: int, prefix: str = "") -> int:
        ago = f"-{older_than_ms / 1000:.3f} seconds"
        if prefix:
            found = cursor.execute(SQLITE_PRUNE_COUNT_PREFIXED, (ago, len(prefix), prefix))
        else:
            found = cursor.execute(SQLITE_PRUNE_COUNT, (ago,))
        return int(found.fetchone()[0])

    def missing_schema(self, cursor: Any) -> list[str]:
        found = {row[0] for row in cursor.execute(SQLITE_TABLES, (TABLE, SEQUENCE, RECORDER))}
        columns = (
            {row[0] for row in cursor.execute(SQLITE_COLUMNS, (TABLE,))} if TABLE in found else None
        )
        lacking = columns is not None and not set(ADDED_COLUMNS) <= columns
        if RECORDER not in found or not (TABLE not in found or SEQUENCE not in found or lacking):
            return []
        applied = {row[0] for row in cursor.execute(MIGRATED)}
        return schema_missing(
            applied,
            table=TABLE not in found,
            sequence=SEQUENCE not in found,
            columns=columns,
            functions=set(),
        )


def _permit(slot: str, start: int, permits: int) -> int | None:
    """The n of a slot key (``slot[start:]``, canonical digits) when it is 1..``permits``."""
    digits = slot[start:]
    if not (digits.isascii() and digits.isdigit()) or digits[0] == "0":
        return None
    permit = int(digits)
    return permit if permit <= permits else None


def _renew(cursor: Any, key: str, owner: str, ttl_ms: int) -> Renewed:
    """Renew ``owner``'s live lease on ``key`` unless it is asked to give it up (preempted)."""
    cursor.execute(SQLITE_RENEW, (offset(ttl_ms), key, owner))
    if cursor.rowcount == 1:
        return True
    asked = cursor.execute(SQLITE_PREEMPTED, (key, owner)).fetchone()
    return False if asked is None else PREEMPTED


def _follow(cursor: Any, base: str, slot: str) -> None:
    """After ``slot`` of ``base`` moved: its own row as long as its latest live slot."""
    cursor.execute(SQLITE_PERMIT_FOLLOW, numbered((f"{base}#", f"{base}$", base, slot)))


def _follow_end(cursor: Any, base: str, how: str, by: str | None) -> None:
    """After a slot of ``base`` ended: its own row until the latest of the other live slots',
    or ended as the slot was when none is left."""
    cursor.execute(SQLITE_PERMIT_LATEST, numbered((f"{base}#", f"{base}$", base)))
    if cursor.rowcount == 0:
        cursor.execute(SQLITE_PERMIT_FREE, numbered((base, how, by)))
