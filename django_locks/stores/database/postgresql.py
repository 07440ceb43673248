"""The database store's PostgreSQL dialect: its SQL, built once, and one method per operation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django_locks.stores.database.operations import (
    FUNCTIONS_MIGRATION,
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

logger = logging.getLogger("django_locks")

CHANNEL = "django_locks_released"
"""The ``NOTIFY`` channel of release notices (``listener.py`` listens on it)."""
LISTEN = f"LISTEN {CHANNEL}"

UNDEFINED_FUNCTION = "42883"
"""PostgreSQL's SQLSTATE for a call of a function that does not exist."""
UNDEFINED_TABLE = "42P01"
"""PostgreSQL's SQLSTATE for a table (or sequence) that does not exist."""

# Each operation is ONE statement in autocommit: the ownership check sits in the statement's
# WHERE, evaluated on the row version the statement has locked, and every time is the server's
# clock_timestamp() (not now(): a statement that waited for a row lock must judge expiry after
# the wait). No session state, no server-side prepared statements, no advisory locks: all of it
# works behind PgBouncer in transaction pooling mode.
_LIVE = "lease.released_at IS NULL AND lease.expires_at > clock_timestamp()"


def _expiry(ttl_ms: str) -> str:
    return f"clock_timestamp() + {ttl_ms} * interval '1 millisecond'"


# ON CONFLICT DO UPDATE locks the existing row first, then evaluates WHERE and SET on it, so the
# nextval() in SET is drawn after the row lock and floored by the row's own token: a sequence
# restored from a backup or reset on a failed-over server never hands a key an old token. (The
# nextval() in VALUES is evaluated before the conflict is known; for an existing key that value
# is simply skipped.) The same owner holding a live lease gets its token back and its lease
# extended: a retry after a timeout never strands the lease.
def _acquire(key: str, owner: str, holder: str, ttl_ms: str) -> str:
    return f"""
INSERT INTO {TABLE} AS lease
    (key, owner, holder, fencing_token, acquired_at, expires_at, released_at)
VALUES ({key}, {owner}, {holder}, nextval('{SEQUENCE}'), clock_timestamp(), {_expiry(ttl_ms)},
    NULL)
ON CONFLICT (key) DO UPDATE SET
    fencing_token = CASE WHEN lease.owner = excluded.owner AND {_LIVE}
        THEN lease.fencing_token
        ELSE greatest(nextval('{SEQUENCE}'), lease.fencing_token + 1) END,
    acquired_at = CASE WHEN lease.owner = excluded.owner AND {_LIVE}
        THEN lease.acquired_at ELSE clock_timestamp() END,
    owner = excluded.owner,
    holder = excluded.holder,
    expires_at = {_expiry(ttl_ms)},
    released_at = NULL
WHERE lease.owner = excluded.owner OR NOT ({_LIVE})
RETURNING lease.fencing_token"""


_FREE = f"""
UPDATE {TABLE} AS lease
SET released_at = clock_timestamp(), expires_at = least(lease.expires_at, clock_timestamp())
WHERE {_LIVE}"""

# Acquire and release, the two calls on a caller's path, are also SQL functions (created by the
# 0002 migration from the statements above): PL/pgSQL plans its statements once per session, so
# a call costs the server a short SELECT to parse instead of the whole statement, prepared
# statements or not, behind PgBouncer too. Until the migration ran, the store sends the
# statements themselves. A change to a statement needs a migration re-creating the functions.
#
# The release commits without waiting for its WAL flush (synchronous_commit off, for its own
# transaction): the freed lease is visible at once, and any later commit that waits for the disk
# (the next holder's acquire, say) flushes it too. Only a server crash before such a commit can
# lose it: the lease then comes back with its old owner, which nobody renews, and lapses at its
# ttl, as after a crash of its holder. Acquire and renew wait for the flush: a lost one could
# hand a token out twice, or end a lease before its holder's deadline. (The SQL comment in the
# release's body still names stores/database.py, this module's old name: the functions' text
# stays exactly what migration 0002 created.)
PG_FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION django_locks_acquire(p_key text, p_owner text, p_holder text,
    p_ttl_ms bigint) RETURNS bigint LANGUAGE plpgsql AS $body$
DECLARE
    token bigint;
BEGIN
    {_acquire("p_key", "p_owner", "p_holder", "p_ttl_ms")} INTO token;
    RETURN token;
END
$body$;
CREATE OR REPLACE FUNCTION django_locks_release(p_key text, p_owner text) RETURNS boolean
LANGUAGE plpgsql AS $body$
BEGIN
    {_FREE} AND lease.key = p_key AND lease.owner = p_owner;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('{CHANNEL}', p_key);
    -- This transaction only: a release need not wait for the disk (see stores/database.py).
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN true;
END
$body$;
"""
PG_DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS django_locks_acquire(text, text, text, bigint);
DROP FUNCTION IF EXISTS django_locks_release(text, text);
"""
# The ttl is cast: an int too large for a bigint is then an error of its own, not a call of a
# function the database does not have (which would turn the functions off for the process).
PG_ACQUIRE_CALL = "SELECT django_locks_acquire(%s, %s, %s, %s::bigint)"
PG_RELEASE_CALL = "SELECT django_locks_release(%s, %s)"
PG_ACQUIRE = _acquire("%s", "%s", "%s", "%s")
PG_RENEW = f"""
UPDATE {TABLE} AS lease SET expires_at = {_expiry("%s")}
WHERE lease.key = %s AND lease.owner = %s AND {_LIVE}
"""
# Every lock a process holds on this database, renewed in one statement: each row is checked
# and moved exactly as PG_RENEW does, and the rows renewed come back.
PG_RENEW_MANY = f"""
UPDATE {TABLE} AS lease SET expires_at = clock_timestamp() + batch.ttl * interval '1 millisecond'
FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS batch (key, owner, ttl)
WHERE lease.key = batch.key AND lease.owner = batch.owner AND {_LIVE}
RETURNING lease.key, lease.owner
"""


def _notifying(update: str) -> str:
    # The release and its notice are one statement: waiters hear of every release (delivered at
    # commit), and the statement's row count is still the number of leases freed.
    return (
        f"WITH freed AS ({update} RETURNING lease.key) "
        f"SELECT pg_notify('{CHANNEL}', freed.key) FROM freed"
    )


PG_RELEASE = _notifying(_FREE + " AND lease.key = %s AND lease.owner = %s")
PG_FORCE_RELEASE = _notifying(_FREE + " AND lease.key = %s")
PG_CLEAR = _notifying(_FREE)
# Testing aid (LockStore.warp): every live lease's expiry moved earlier, as if time had passed.
PG_WARP = f"""
UPDATE {TABLE} AS lease SET expires_at = lease.expires_at - %s * interval '1 millisecond'
WHERE {_LIVE}"""
PG_LEASES = f"""
SELECT lease.key, lease.owner, lease.holder, lease.fencing_token, lease.acquired_at,
    CASE WHEN lease.released_at IS NOT NULL THEN 'released'
         WHEN lease.expires_at > clock.now THEN 'held' ELSE 'expired' END,
    (extract(epoch FROM lease.expires_at - clock.now) * 1000)::bigint
FROM {TABLE} AS lease, (SELECT clock_timestamp() AS now) AS clock
"""
_HELD = "lease.released_at IS NULL AND lease.expires_at > clock.now"
PG_LEASES_HELD = f"{PG_LEASES} WHERE {_HELD}"
PG_LEASE = f"{PG_LEASES} WHERE lease.key = %s"
PG_LEASE_HELD = f"{PG_LEASE} AND {_HELD}"

# Pruning deletes rows whose key then starts over from the sequence alone, without the row's own
# token as a floor. So each batch first raises the sequence to the batch's highest token, while
# holding a lock that keeps every acquire out until the rows are gone: an acquire that drew its
# token before the raise and then inserted the pruned key would otherwise hand out an old token
# (after a sequence reset, the rows are ahead of the sequence). SHARE ROW EXCLUSIVE conflicts
# with the ROW EXCLUSIVE lock an INSERT / UPDATE takes before it evaluates anything.
_STALE = "expires_at < clock_timestamp() - %s * interval '1 millisecond'"
PG_PRUNE_LOCK = f"LOCK TABLE {TABLE} IN SHARE ROW EXCLUSIVE MODE"
PG_PRUNE_BATCH = f"SELECT key, fencing_token FROM {TABLE} WHERE {_STALE} LIMIT %s"
PG_PRUNE_FLOOR = f"""
SELECT setval('{SEQUENCE}', greatest((SELECT last_value FROM {SEQUENCE}), %s))
"""
PG_PRUNE_DELETE = f"DELETE FROM {TABLE} WHERE key = ANY(%s) AND {_STALE}"
PG_PRUNE_COUNT = f"SELECT count(*) FROM {TABLE} WHERE {_STALE}"

PG_MISSING = (
    f"SELECT to_regclass('{TABLE}') IS NULL, to_regclass('{SEQUENCE}') IS NULL, "
    "to_regprocedure('django_locks_acquire(text, text, text, bigint)') IS NULL "
    "OR to_regprocedure('django_locks_release(text, text)') IS NULL, "
    f"to_regclass('{RECORDER}')"
)


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


class PostgreSQLOperations(Operations):
    """PostgreSQL: one statement per operation in autocommit, on the connection's one cursor."""

    vendor = "postgresql"
    recreate_sequence = f"CREATE SEQUENCE {SEQUENCE} AS bigint CACHE 1;"

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self.functions = True  # until the database says it has none

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

    def acquire(self, cursor: Any, key: str, owner: str, holder: str, ttl_ms: int) -> int | None:
        if not self._call_function(cursor, PG_ACQUIRE_CALL, (key, owner, holder, ttl_ms)):
            cursor.execute(PG_ACQUIRE, (key, owner, holder, ttl_ms, ttl_ms))
        row = cursor.fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def renew(self, cursor: Any, key: str, owner: str, ttl_ms: int) -> bool:
        cursor.execute(PG_RENEW, (ttl_ms, key, owner))
        return bool(cursor.rowcount == 1)

    def renew_many(
        self, cursor: Any, leases: Sequence[tuple[str, str, int]]
    ) -> set[tuple[str, str]]:
        keys, owners, ttls = (list(column) for column in zip(*leases, strict=True))
        cursor.execute(PG_RENEW_MANY, (keys, owners, ttls))
        return {(key, owner) for key, owner in cursor.fetchall()}

    def release(self, cursor: Any, key: str, owner: str) -> bool:
        if self._call_function(cursor, PG_RELEASE_CALL, (key, owner)):
            return bool(cursor.fetchone()[0])
        cursor.execute(PG_RELEASE, (key, owner))
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

    def force_release(self, cursor: Any, key: str) -> int:
        cursor.execute(PG_FORCE_RELEASE, (key,))
        return int(cursor.rowcount)

    def clear(self, cursor: Any) -> int:
        cursor.execute(PG_CLEAR)
        return int(cursor.rowcount)

    def warp(self, cursor: Any, delta_ms: int) -> None:
        cursor.execute(PG_WARP, (delta_ms,))

    def leases(self, cursor: Any, include_inactive: bool) -> list[LeaseRow]:
        cursor.execute(PG_LEASES if include_inactive else PG_LEASES_HELD)
        return list(cursor.fetchall())

    def lease(self, cursor: Any, key: str, include_inactive: bool) -> LeaseRow | None:
        cursor.execute(PG_LEASE if include_inactive else PG_LEASE_HELD, (key,))
        row = cursor.fetchone()
        return None if row is None else tuple(row)

    def prune(self, cursor: Any, older_than_ms: int, limit: int) -> tuple[int, bool]:
        # One transaction per batch on the store's autocommit connection: the table lock is
        # held from the floor's raise until the batch's rows are gone, and no longer.
        cursor.execute("BEGIN")
        try:
            cursor.execute(PG_PRUNE_LOCK)
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

    def count_prunable(self, cursor: Any, older_than_ms: int) -> int:
        cursor.execute(PG_PRUNE_COUNT, (older_than_ms,))
        return int(cursor.fetchone()[0])

    def missing_schema(self, cursor: Any) -> list[str]:
        cursor.execute(PG_MISSING)
        table_missing, sequence_missing, functions_missing, recorder = cursor.fetchone()
        if recorder is None or not (table_missing or sequence_missing or functions_missing):
            return []
        cursor.execute(MIGRATED)
        applied = {row[0] for row in cursor.fetchall()}
        gone = {TABLE: table_missing, SEQUENCE: sequence_missing}
        missing = [name for name, is_gone in gone.items() if is_gone and applied]
        if functions_missing and FUNCTIONS_MIGRATION in applied:
            missing.append("SQL functions")
        return missing
