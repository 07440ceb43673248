"""The database store's PostgreSQL dialect: one method per operation, running the statements of
``postgresql_sql.py`` (its SQL, built once)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django_locks.exceptions import PermitsMismatchError, StoreError
from django_locks.stores.base import (
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
    PERMITS_MIGRATION,
    PREEMPT_MIGRATION,
    SEQUENCE,
    HolderRow,
    LeaseRow,
    Operations,
    schema_missing,
)
from django_locks.stores.database.postgresql_permits_sql import (
    PG_ACQUIRE_PERMIT_CALL,
    PG_ACQUIRE_PLAIN_CALL,
    PG_END_SLOT_CALL,
    PG_FORCE_END_CALL,
    PG_RENEW_SLOTS_CALL,
)
from django_locks.stores.database.postgresql_preempt_sql import (
    PG_ACQUIRE_LEASE_CALL,
    PG_ACQUIRE_SLOT_CALL,
    PG_PREEMPT_CALL,
    PG_RENEW_BATCH,
    PG_RENEW_CALL,
    PG_RENEW_PERMITS_CALL,
)
from django_locks.stores.database.postgresql_sql import (
    PG_ACQUIRE_AS,
    PG_ACQUIRE_AS_CALL,
    PG_CLEAR,
    PG_CLEAR_TICKS,
    PG_END,
    PG_END_CALL,
    PG_FORCE_END,
    PG_LEASE,
    PG_LEASE_HELD,
    PG_LEASES,
    PG_LEASES_HELD,
    PG_LEAVE,
    PG_MISSING,
    PG_PRUNE_BATCH,
    PG_PRUNE_BATCH_PREFIXED,
    PG_PRUNE_COUNT,
    PG_PRUNE_COUNT_PREFIXED,
    PG_PRUNE_DELETE,
    PG_PRUNE_FLOOR,
    PG_PRUNE_GUARD,
    PG_PRUNE_LOCK,
    PG_RECORD_TICK,
    PG_RECORDED_TICK,
    PG_RENEW,
    PG_RENEW_MANY,
    PG_WARP,
    SIGNATURES,
)

if TYPE_CHECKING:
    from django_locks.stores.database.connections import StoreConnection

T = TypeVar("T")

logger = logging.getLogger("django_locks")

UNDEFINED_FUNCTION = "42883"
"""PostgreSQL's SQLSTATE for a call of a function that does not exist."""
UNDEFINED_TABLE = "42P01"
"""PostgreSQL's SQLSTATE for a table (or sequence) that does not exist."""
UNDEFINED_COLUMN = "42703"
"""PostgreSQL's SQLSTATE for a column that does not exist (migration 0003 not applied)."""


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


class PostgreSQLOperations(Operations):
    """PostgreSQL: one statement per operation in autocommit, on the connection's one cursor."""

    vendor = "postgresql"
    supports_permits = True  # with migration 0005's functions (a clear error without them)
    recreate_sequence = f"CREATE SEQUENCE {SEQUENCE} AS bigint CACHE 1;"

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self.functions = True  # until the database says it has none
        # Migration 0005's, until the database says it has none (found again by the next
        # acquire_permit, which always calls its function: then migrated meanwhile).
        self.permit_functions = True
        # Migration 0006's, likewise (found again by the next preempt, which always calls its
        # function); without them the calls above, which know no preempt requests.
        self.preempt_functions = True

    def run(
        self,
        conn: StoreConnection,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        deadline: float,
        write: bool,
        busy_wait: float | None,
    ) -> T:
        if conn.cursor is None:
            conn.cursor = conn.raw.cursor()  # one per connection: made once, not per call
        return fn(conn.cursor, *args)

    def missing_table(self, exc: BaseException) -> bool:
        return _sqlstate(exc) == UNDEFINED_TABLE

    def missing_column(self, exc: BaseException) -> bool:
        return _sqlstate(exc) == UNDEFINED_COLUMN

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
        params = (key, owner, holder, kind, detail, ttl_ms)
        if self._call_preempt(cursor, PG_ACQUIRE_LEASE_CALL, params) or (
            self.permit_functions and self._call_plain(cursor, params)
        ):
            taken, *held, live = cursor.fetchone()
            if taken is not None:
                return int(taken)
            if live is not None:
                raise PermitsMismatchError(key, 1, int(live))
            return None if held[0] is None else tuple(held)
        if self._call_function(cursor, PG_ACQUIRE_AS_CALL, params):
            taken, *held = cursor.fetchone()
            if taken is not None:
                return int(taken)
            return None if held[0] is None else tuple(held)
        named = {"key": key, "owner": owner, "holder": holder, "kind": kind, "detail": detail}
        cursor.execute(PG_ACQUIRE_AS, {**named, "ttl": ttl_ms})
        row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

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
        params = (key, owner, holder, kind, detail, ttl_ms, permits)
        if not self._call_preempt(cursor, PG_ACQUIRE_SLOT_CALL, params):
            self._call_permits(cursor, PG_ACQUIRE_PERMIT_CALL, params)
        self.permit_functions = True
        taken, permit, live, *held = cursor.fetchone()
        if taken is not None:
            return PermitGrant(int(taken), int(permit))
        if live is not None:
            raise PermitsMismatchError(key, permits, int(live))
        return None if held[0] is None else tuple(held)

    def renew(self, cursor: Any, key: str, owner: str, ttl_ms: int) -> Renewed:
        if isinstance(key, Slot):
            return self._renew_slots(cursor, [(key, owner, ttl_ms)], None).get((key, owner), False)
        if self._call_preempt(cursor, PG_RENEW_CALL, (key, owner, ttl_ms)):
            preempted = cursor.fetchone()[0]
            return False if preempted is None else PREEMPTED if preempted else True
        cursor.execute(PG_RENEW, (ttl_ms, key, owner))
        return bool(cursor.rowcount == 1)

    def leave(self, cursor: Any, key: str, owner: str, ttl_ms: int, how: LeaveReason) -> bool:
        if isinstance(key, Slot):
            return bool(self._renew_slots(cursor, [(key, owner, ttl_ms)], how))
        cursor.execute(PG_LEAVE, (ttl_ms, how, key, owner))
        return bool(cursor.rowcount == 1)

    def renew_many(
        self, cursor: Any, leases: Sequence[tuple[str, str, int]]
    ) -> dict[tuple[str, str], Renewed]:
        if any(isinstance(key, Slot) for key, _, _ in leases):
            return self._renew_slots(cursor, leases, None)
        keys, owners, ttls = (list(column) for column in zip(*leases, strict=True))
        if self._call_preempt(cursor, PG_RENEW_BATCH, (keys, owners, ttls)):
            return _answers(cursor.fetchall())
        cursor.execute(PG_RENEW_MANY, (keys, owners, ttls))
        return {(key, owner): True for key, owner in cursor.fetchall()}

    def _renew_slots(
        self, cursor: Any, leases: Sequence[tuple[str, str, int]], how: LeaveReason | None
    ) -> dict[tuple[str, str], Renewed]:
        """Renew (or with ``how``, leave: 0005's function, which knows no requests)
        ``leases``, some of them slots, in one call: their bases locked first, in key order,
        and moved with them."""
        keys = [str(key) for key, _, _ in leases]
        bases = [key.base if isinstance(key, Slot) else None for key, _, _ in leases]
        owners = [owner for _, owner, _ in leases]
        ttls = [ttl for _, _, ttl in leases]
        if how is None and self._call_preempt(
            cursor, PG_RENEW_PERMITS_CALL, (keys, owners, ttls, bases)
        ):
            return _answers(cursor.fetchall())
        self._call_permits(cursor, PG_RENEW_SLOTS_CALL, (keys, owners, ttls, bases, how))
        return {(key, owner): True for key, owner in cursor.fetchall()}

    def preempt(self, cursor: Any, key: str) -> int | None:
        try:
            cursor.execute(PG_PREEMPT_CALL, (key,))
        except Exception as exc:
            if _sqlstate(exc) != UNDEFINED_FUNCTION:
                raise
            self.preempt_functions = False
            raise StoreError(
                f"The database {self.using!r} lacks the django_locks SQL functions of "
                f"migration {PREEMPT_MIGRATION}, which preempt requests need: run `manage.py "
                f"migrate django_locks --database {self.using}`."
            ) from exc
        self.preempt_functions = True
        token = cursor.fetchone()[0]
        return None if token is None else int(token)

    def record_tick(self, cursor: Any, key: str, owner: str, tick_ms: int) -> bool:
        cursor.execute(PG_RECORD_TICK, (tick_ms, str(key), owner))
        return bool(cursor.rowcount == 1)

    def recorded_tick(self, cursor: Any, key: str) -> tuple[int, int] | None:
        cursor.execute(PG_RECORDED_TICK, (str(key),))
        row = cursor.fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def end(self, cursor: Any, key: str, owner: str, how: ReleaseReason) -> bool:
        if isinstance(key, Slot):
            self._call_permits(cursor, PG_END_SLOT_CALL, (key.base, str(key), owner, how))
            return bool(cursor.fetchone()[0])
        if self._call_function(cursor, PG_END_CALL, (key, owner, how)):
            return bool(cursor.fetchone()[0])
        cursor.execute(PG_END, (how, key, owner))
        return bool(cursor.rowcount == 1)

    def _call_function(self, cursor: Any, sql: str, params: tuple[Any, ...]) -> bool:
        """Call one of the store's SQL functions; ``False`` when the database has none (the
        0002 migration has not run there yet): the statements are then sent instead."""
        if not self.functions:
            return False
        try:
            cursor.execute(sql, params)
        except Exception as exc:
            if _sqlstate(exc) != UNDEFINED_FUNCTION:
                raise
            self.functions = False
            logger.warning(
                "The database %r has no django_locks SQL functions: the lock store sends whole "
                "statements instead, which costs the database more per lock. Run `manage.py "
                "migrate django_locks --database %s`.",
                self.using,
                self.using,
            )
            return False
        return True

    def _call_plain(self, cursor: Any, params: tuple[Any, ...]) -> bool:
        """Migration 0005's plain acquire; ``False`` (and 0003's from now on) when the database
        lacks it: a key taken with permits is then taken by no process of this release."""
        try:
            cursor.execute(PG_ACQUIRE_PLAIN_CALL, params)
        except Exception as exc:
            if _sqlstate(exc) != UNDEFINED_FUNCTION:
                raise
            self.permit_functions = False
            logger.warning(
                "The database %r lacks the django_locks SQL functions of migration %s: keys "
                "cannot be taken with permits there. Run `manage.py migrate django_locks "
                "--database %s`.",
                self.using,
                PERMITS_MIGRATION,
                self.using,
            )
            return False
        return True

    def _call_preempt(self, cursor: Any, sql: str, params: tuple[Any, ...]) -> bool:
        """Call one of migration 0006's functions (or send its batch renewal, which reads its
        column); ``False`` (and the earlier migrations' calls and statements from now on) when
        the database lacks them: renewals then ignore preempt requests, and acquires leave a
        stale request on the row (which no renewal answers: it names another token)."""
        if not self.preempt_functions:
            return False
        try:
            cursor.execute(sql, params)
        except Exception as exc:
            if _sqlstate(exc) not in (UNDEFINED_FUNCTION, UNDEFINED_COLUMN):
                raise
            self.preempt_functions = False
            logger.warning(
                "The database %r lacks the django_locks column or SQL functions of migration "
                "%s: preempt requests (on_conflict='replace') are refused there, and this "
                "process's renewals ignore them. Run `manage.py migrate django_locks "
                "--database %s`.",
                self.using,
                PREEMPT_MIGRATION,
                self.using,
            )
            return False
        return True

    def _call_permits(self, cursor: Any, sql: str, params: tuple[Any, ...]) -> None:
        """Call one of migration 0005's functions, which permits need: without them, a
        ``StoreError`` naming the migration."""
        try:
            cursor.execute(sql, params)
        except Exception as exc:
            if _sqlstate(exc) != UNDEFINED_FUNCTION:
                raise
            self.permit_functions = False
            raise StoreError(
                f"The database {self.using!r} lacks the django_locks SQL functions of "
                f"migration {PERMITS_MIGRATION}, which permits need: run `manage.py migrate "
                f"django_locks --database {self.using}`."
            ) from exc

    def force_end(self, cursor: Any, key: str, by: str | None) -> int:
        # 1 when it freed the key's lease, or its slots (and its own record), or a slot.
        if self.permit_functions:
            try:
                cursor.execute(PG_FORCE_END_CALL, (str(key), by))
            except Exception as exc:
                if _sqlstate(exc) != UNDEFINED_FUNCTION:
                    raise
                self.permit_functions = False
            else:
                return min(int(cursor.fetchone()[0]), 1)
        cursor.execute(PG_FORCE_END, (by, key))
        return int(cursor.rowcount)

    def clear(self, cursor: Any) -> int:
        cursor.execute(PG_CLEAR)
        freed = int(cursor.rowcount)
        cursor.execute(PG_CLEAR_TICKS)
        return freed

    def warp(self, cursor: Any, delta_ms: int) -> None:
        cursor.execute(PG_WARP, (delta_ms,))

    def leases(self, cursor: Any, include_inactive: bool) -> list[LeaseRow]:
        cursor.execute(PG_LEASES if include_inactive else PG_LEASES_HELD)
        return list(cursor.fetchall())

    def lease(self, cursor: Any, key: str, include_inactive: bool) -> LeaseRow | None:
        cursor.execute(PG_LEASE if include_inactive else PG_LEASE_HELD, (key,))
        row = cursor.fetchone()
        return None if row is None else tuple(row)

    def prune(
        self, cursor: Any, older_than_ms: int, limit: int, prefix: str = ""
    ) -> tuple[int, bool]:
        # One transaction per batch on the store's autocommit connection: the table lock is
        # held from the floor's raise until the batch's rows are gone, and no longer.
        cursor.execute("BEGIN")
        try:
            cursor.execute(PG_PRUNE_GUARD)
            cursor.execute(PG_PRUNE_LOCK)
            if prefix:
                cursor.execute(PG_PRUNE_BATCH_PREFIXED, (older_than_ms, len(prefix), prefix, limit))
            else:
                cursor.execute(PG_PRUNE_BATCH, (older_than_ms, limit))
            batch = cursor.fetchall()
            deleted = 0
            if batch:
                cursor.execute(PG_PRUNE_FLOOR, (max(int(token) for _, token in batch),))
                cursor.execute(PG_PRUNE_DELETE, ([key for key, _ in batch], older_than_ms))
                deleted = int(cursor.rowcount)
            cursor.execute("COMMIT")
        except BaseException:
            # The connection is discarded after a failed call; the rollback frees the table at
            # once rather than when the server notices.
            with contextlib.suppress(Exception):
                cursor.execute("ROLLBACK")
            raise
        return deleted, deleted > 0 and len(batch) == limit

    def count_prunable(self, cursor: Any, older_than_ms: int, prefix: str = "") -> int:
        if prefix:
            cursor.execute(PG_PRUNE_COUNT_PREFIXED, (older_than_ms, len(prefix), prefix))
        else:
            cursor.execute(PG_PRUNE_COUNT, (older_than_ms,))
        return int(cursor.fetchone()[0])

    def missing_schema(self, cursor: Any) -> list[str]:
        cursor.execute(PG_MISSING)
        table_missing, sequence_missing, recorder, columns, *functions = cursor.fetchone()
        gone = dict(zip(SIGNATURES, functions, strict=True))
        lacking = not table_missing and not set(ADDED_COLUMNS) <= set(columns)
        if recorder is None or not (
            table_missing or sequence_missing or lacking or any(gone.values())
        ):
            return []
        cursor.execute(MIGRATED)
        applied = {row[0] for row in cursor.fetchall()}
        return schema_missing(
            applied,
            table=bool(table_missing),
            sequence=bool(sequence_missing),
            columns=None if table_missing else set(columns),
            functions={signature for signature, is_gone in gone.items() if is_gone},
        )


def _answers(rows: Sequence[tuple[str, str, bool]]) -> dict[tuple[str, str], Renewed]:
    """The answers of 0006's renewal functions: each lease found, whether it is preempted."""
    return {(key, owner): PREEMPTED if preempted else True for key, owner, preempted in rows}
