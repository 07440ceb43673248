"""``DatabaseStore``: leases in the project's own database (PostgreSQL; SQLite on one machine)."""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils.connection import ConnectionDoesNotExist
from django.utils.dateparse import parse_datetime

from django_locks.durations import Duration, timeout_seconds
from django_locks.exceptions import StoreError
from django_locks.stores.base import LeaseInfo, LeaseState, LockStore, holder_name
from django_locks.stores.database_connections import Pools, register
from django_locks.stores.database_listener import CHANNEL, Listener
from django_locks.stores.database_teardown import track

T = TypeVar("T")

logger = logging.getLogger("django_locks")

SUPPORTED_VENDORS = ("postgresql", "sqlite")
TABLE = "django_locks_lease"
SEQUENCE = "django_locks_lease_fencing_token_seq"

# PostgreSQL. Each operation is ONE statement in autocommit: the ownership check sits in the
# statement's WHERE, evaluated on the row version the statement has locked, and every time is
# the server's clock_timestamp() (not now(): a statement that waited for a row lock must judge
# expiry after the wait). No session state, no server-side prepared statements, no advisory
# locks: all of it works behind PgBouncer in transaction pooling mode.
_PG_LIVE = "lease.released_at IS NULL AND lease.expires_at > clock_timestamp()"


def _pg_expiry(ttl_ms: str) -> str:
    return f"clock_timestamp() + {ttl_ms} * interval '1 millisecond'"


# ON CONFLICT DO UPDATE locks the existing row first, then evaluates WHERE and SET on it, so the
# nextval() in SET is drawn after the row lock and floored by the row's own token: a sequence
# restored from a backup or reset on a failed-over server never hands a key an old token. (The
# nextval() in VALUES is evaluated before the conflict is known; for an existing key that value
# is simply skipped.) The same owner holding a live lease gets its token back and its lease
# extended: a retry after a timeout never strands the lease.
def _pg_acquire(key: str, owner: str, holder: str, ttl_ms: str) -> str:
    return f"""
INSERT INTO {TABLE} AS lease
    (key, owner, holder, fencing_token, acquired_at, expires_at, released_at)
VALUES ({key}, {owner}, {holder}, nextval('{SEQUENCE}'), clock_timestamp(), {_pg_expiry(ttl_ms)},
    NULL)
ON CONFLICT (key) DO UPDATE SET
    fencing_token = CASE WHEN lease.owner = excluded.owner AND {_PG_LIVE}
        THEN lease.fencing_token
        ELSE greatest(nextval('{SEQUENCE}'), lease.fencing_token + 1) END,
    acquired_at = CASE WHEN lease.owner = excluded.owner AND {_PG_LIVE}
        THEN lease.acquired_at ELSE clock_timestamp() END,
    owner = excluded.owner,
    holder = excluded.holder,
    expires_at = {_pg_expiry(ttl_ms)},
    released_at = NULL
WHERE lease.owner = excluded.owner OR NOT ({_PG_LIVE})
RETURNING lease.fencing_token"""


_PG_FREE = f"""
UPDATE {TABLE} AS lease
SET released_at = clock_timestamp(), expires_at = least(lease.expires_at, clock_timestamp())
WHERE {_PG_LIVE}"""

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
# hand a token out twice, or end a lease before its holder's deadline.
PG_FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION django_locks_acquire(p_key text, p_owner text, p_holder text,
    p_ttl_ms bigint) RETURNS bigint LANGUAGE plpgsql AS $body$
DECLARE
    token bigint;
BEGIN
    {_pg_acquire("p_key", "p_owner", "p_holder", "p_ttl_ms")} INTO token;
    RETURN token;
END
$body$;
CREATE OR REPLACE FUNCTION django_locks_release(p_key text, p_owner text) RETURNS boolean
LANGUAGE plpgsql AS $body$
BEGIN
    {_PG_FREE} AND lease.key = p_key AND lease.owner = p_owner;
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
PG_ACQUIRE = _pg_acquire("%s", "%s", "%s", "%s")
_PG_EXPIRY = _pg_expiry("%s")
PG_RENEW = f"""
UPDATE {TABLE} AS lease SET expires_at = {_PG_EXPIRY}
WHERE lease.key = %s AND lease.owner = %s AND {_PG_LIVE}
"""
# Every lock a process holds on this database, renewed in one statement: each row is checked
# and moved exactly as PG_RENEW does, and the rows renewed come back.
PG_RENEW_MANY = f"""
UPDATE {TABLE} AS lease SET expires_at = clock_timestamp() + batch.ttl * interval '1 millisecond'
FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS batch (key, owner, ttl)
WHERE lease.key = batch.key AND lease.owner = batch.owner AND {_PG_LIVE}
RETURNING lease.key, lease.owner
"""


def _pg_notifying(update: str) -> str:
    # The release and its notice are one statement: waiters hear of every release (delivered at
    # commit), and the statement's row count is still the number of leases freed.
    return (
        f"WITH freed AS ({update} RETURNING lease.key) "
        f"SELECT pg_notify('{CHANNEL}', freed.key) FROM freed"
    )


PG_RELEASE = _pg_notifying(_PG_FREE + " AND lease.key = %s AND lease.owner = %s")
PG_FORCE_RELEASE = _pg_notifying(_PG_FREE + " AND lease.key = %s")
PG_CLEAR = _pg_notifying(_PG_FREE)
# Testing aid (LockStore.warp): every live lease's expiry moved earlier, as if time had passed.
PG_WARP = f"""
UPDATE {TABLE} AS lease SET expires_at = lease.expires_at - %s * interval '1 millisecond'
WHERE {_PG_LIVE}"""
PG_LEASES = f"""
SELECT lease.key, lease.owner, lease.holder, lease.fencing_token, lease.acquired_at,
    CASE WHEN lease.released_at IS NOT NULL THEN 'released'
         WHEN lease.expires_at > clock.now THEN 'held' ELSE 'expired' END,
    (extract(epoch FROM lease.expires_at - clock.now) * 1000)::bigint
FROM {TABLE} AS lease, (SELECT clock_timestamp() AS now) AS clock
"""
PG_LEASES_HELD = PG_LEASES + " WHERE lease.released_at IS NULL AND lease.expires_at > clock.now"
RECORDER = "django_migrations"
FUNCTIONS_MIGRATION = "0002_sql_functions"
PG_MISSING = (
    f"SELECT to_regclass('{TABLE}') IS NULL, to_regclass('{SEQUENCE}') IS NULL, "
    "to_regprocedure('django_locks_acquire(text, text, text, bigint)') IS NULL "
    "OR to_regprocedure('django_locks_release(text, text)') IS NULL, "
    f"to_regclass('{RECORDER}')"
)
MIGRATED = f"SELECT name FROM {RECORDER} WHERE app = 'django_locks'"

# SQLite. Every write runs inside BEGIN IMMEDIATE (the database's write lock, taken up front so
# that concurrent writers wait for it instead of failing to upgrade a read lock), which makes the
# few statements below one atomic step. Times are Django's text format, from SQLite's 'now' (the
# machine's clock: one machine only), compared through julianday(). The token floor is the
# one-row table holding the highest token ever handed out, so a pruned row's key never goes back.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
_SQLITE_EXPIRY = "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)"
_SQLITE_LIVE = "released_at IS NULL AND julianday(expires_at) > julianday('now')"
SQLITE_ACQUIRE = f"""
INSERT INTO {TABLE} (key, owner, holder, fencing_token, acquired_at, expires_at, released_at)
VALUES (?, ?, ?, (SELECT value + 1 FROM {SEQUENCE} WHERE id = 1), {_SQLITE_NOW}, {_SQLITE_EXPIRY},
    NULL)
ON CONFLICT (key) DO UPDATE SET
    fencing_token = CASE WHEN owner = excluded.owner AND {_SQLITE_LIVE}
        THEN fencing_token ELSE max(fencing_token + 1, excluded.fencing_token) END,
    acquired_at = CASE WHEN owner = excluded.owner AND {_SQLITE_LIVE}
        THEN acquired_at ELSE excluded.acquired_at END,
    owner = excluded.owner,
    holder = excluded.holder,
    expires_at = excluded.expires_at,
    released_at = NULL
WHERE owner = excluded.owner OR NOT ({_SQLITE_LIVE})
"""
SQLITE_TOKEN = f"SELECT fencing_token FROM {TABLE} WHERE key = ?"
SQLITE_RAISE_FLOOR = f"UPDATE {SEQUENCE} SET value = max(value, ?) WHERE id = 1"
SQLITE_RENEW = f"""
UPDATE {TABLE} SET expires_at = {_SQLITE_EXPIRY} WHERE key = ? AND owner = ? AND {_SQLITE_LIVE}
"""
_SQLITE_FREE = f"""
UPDATE {TABLE} SET released_at = {_SQLITE_NOW},
    expires_at = CASE WHEN julianday(expires_at) > julianday('now') THEN {_SQLITE_NOW}
        ELSE expires_at END
WHERE {_SQLITE_LIVE}"""
SQLITE_RELEASE = _SQLITE_FREE + " AND key = ? AND owner = ?"
SQLITE_FORCE_RELEASE = _SQLITE_FREE + " AND key = ?"
SQLITE_CLEAR = _SQLITE_FREE
SQLITE_WARP = f"""
UPDATE {TABLE} SET expires_at = strftime('%Y-%m-%d %H:%M:%f', expires_at, ?) WHERE {_SQLITE_LIVE}"""
SQLITE_LEASES = f"""
SELECT key, owner, holder, fencing_token, acquired_at,
    CASE WHEN released_at IS NOT NULL THEN 'released'
         WHEN julianday(expires_at) > julianday('now') THEN 'held' ELSE 'expired' END,
    CAST(round((julianday(expires_at) - julianday('now')) * 86400000) AS integer)
FROM {TABLE}
"""
SQLITE_LEASES_HELD = SQLITE_LEASES + f" WHERE {_SQLITE_LIVE}"
SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?)"

UNDEFINED_FUNCTION = "42883"
"""PostgreSQL's SQLSTATE for a call of a function that does not exist."""

CHECK_TIMEOUT = 2.0
"""Seconds the I/O checks (``check --database``) wait for the database at most."""


class DatabaseStore(LockStore):
    """Leases in the ``Lease`` table of the database ``using``, on connections of the store's own.

    Options (``LOCKS["OPTIONS"]``): ``using``, the ``DATABASES`` alias (PostgreSQL, or SQLite
    for one machine); ``timeout``, the default bound of one call (a duration, 5 s);
    ``max_connections``, ``None`` for one connection per thread that uses the store, or a number
    of connections shared by the threads' acquire and release calls (renewals always keep a
    connection per thread, so requests cannot starve the renewer); and ``listen_using``, where
    waiters ``LISTEN`` for release notices on PostgreSQL: ``True`` (the ``using`` alias), the
    alias of a direct connection when ``using`` goes through PgBouncer in transaction mode, or
    ``False`` (waiters sleep through their backoff).

    Never the request's connection: a lock taken inside ``transaction.atomic()`` is committed at
    once and survives a rollback. Connects from the alias's current ``settings_dict`` (test
    databases included) on first use; safe from any thread and across ``fork()``; ``close()``
    closes every connection of this process. SQLite's in-memory test database (shared cache)
    goes through Django's own connection, since a second connection would find it locked.
    """

    def __init__(
        self,
        using: str = DEFAULT_DB_ALIAS,
        *,
        timeout: Duration = 5,
        max_connections: int | None = None,
        listen_using: str | bool = True,
    ) -> None:
        if not isinstance(using, str) or not using:
            raise ImproperlyConfigured(
                f"DatabaseStore's `using` must be an alias of DATABASES, got {using!r}."
            )
        self.using = using
        try:
            self.timeout = timeout_seconds(timeout, name="timeout")
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"DatabaseStore: {exc}.") from exc
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ImproperlyConfigured(
                "DatabaseStore's `max_connections` must be a positive int or None (one "
                f"connection per thread), got {max_connections!r}."
            )
        self.max_connections = max_connections
        if listen_using is True:
            listen_using = using
        if listen_using is not False and (not isinstance(listen_using, str) or not listen_using):
            raise ImproperlyConfigured(
                "DatabaseStore's `listen_using` must be True (listen on `using`), an alias of "
                f"DATABASES that reaches PostgreSQL directly, or False, got {listen_using!r}."
            )
        self.listen_using: str | None = listen_using or None
        self._listener: Listener | None = None
        for message in _configuration_messages(using):
            raise ImproperlyConfigured(f"{message.msg} {message.hint}")
        self._pools = Pools(self)
        self._functions = True  # until the database says it has none
        register(self._pools)
        track(self)  # closes its connections before Django destroys a test database

    def __repr__(self) -> str:
        return f"<DatabaseStore using={self.using!r}>"

    # The contract.

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        def pg(cursor: Any) -> int | None:
            holder = holder_name()
            if not self._call_function(cursor, PG_ACQUIRE_CALL, (key, owner, holder, ttl_ms)):
                cursor.execute(PG_ACQUIRE, (key, owner, holder, ttl_ms, ttl_ms))
            row = cursor.fetchone()
            return None if row is None or row[0] is None else int(row[0])

        def sqlite(cursor: Any) -> int | None:
            cursor.execute(SQLITE_ACQUIRE, (key, owner, holder_name(), _sqlite_offset(ttl_ms)))
            if cursor.rowcount != 1:
                return None
            token = int(cursor.execute(SQLITE_TOKEN, (key,)).fetchone()[0])
            cursor.execute(SQLITE_RAISE_FLOOR, (token,))
            return token

        return self._pools.run(pg, sqlite, timeout, renewal=False)

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> bool:
        def pg(cursor: Any) -> bool:
            cursor.execute(PG_RENEW, (ttl_ms, key, owner))
            return bool(cursor.rowcount == 1)

        def sqlite(cursor: Any) -> bool:
            cursor.execute(SQLITE_RENEW, (_sqlite_offset(ttl_ms), key, owner))
            return bool(cursor.rowcount == 1)

        return self._pools.run(pg, sqlite, timeout, renewal=True)

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> list[bool]:
        if not leases:
            return []

        def pg(cursor: Any) -> set[tuple[str, str]]:
            keys, owners, ttls = (list(column) for column in zip(*leases, strict=True))
            cursor.execute(PG_RENEW_MANY, (keys, owners, ttls))
            return {(key, owner) for key, owner in cursor.fetchall()}

        def sqlite(cursor: Any) -> set[tuple[str, str]]:
            renewed = set()
            for key, owner, ttl_ms in leases:  # one transaction (BEGIN IMMEDIATE): one step
                cursor.execute(SQLITE_RENEW, (_sqlite_offset(ttl_ms), key, owner))
                if cursor.rowcount == 1:
                    renewed.add((key, owner))
            return renewed

        renewed = self._pools.run(pg, sqlite, timeout, renewal=True)
        return [(key, owner) in renewed for key, owner, _ in leases]

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        def pg(cursor: Any) -> bool:
            if self._call_function(cursor, PG_RELEASE_CALL, (key, owner)):
                return bool(cursor.fetchone()[0])
            cursor.execute(PG_RELEASE, (key, owner))
            return bool(cursor.rowcount == 1)

        def sqlite(cursor: Any) -> bool:
            cursor.execute(SQLITE_RELEASE, (key, owner))
            return bool(cursor.rowcount == 1)

        return self._pools.run(pg, sqlite, timeout, renewal=False)

    def _call_function(self, cursor: Any, sql: str, params: tuple[Any, ...]) -> bool:
        """Call one of the store's SQL functions; ``False`` when the database has none (the
        0002 migration has not run there yet): this store then sends the statements instead."""
        if not self._functions:
            return False
        try:
            cursor.execute(sql, params)
        except Exception as exc:
            sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
            if sqlstate != UNDEFINED_FUNCTION:
                raise
            self._functions = False
            logger.warning(
                "The database %r has no django_locks SQL functions: the lock store sends whole "
                "statements instead, which costs the database more per lock. Run `manage.py "
                "migrate django_locks --database %s`.",
                self.using,
                self.using,
            )
            return False
        return True

    # Optional capabilities.

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        def pg(cursor: Any) -> list[Any]:
            cursor.execute(PG_LEASES if include_inactive else PG_LEASES_HELD)
            return list(cursor.fetchall())

        def sqlite(cursor: Any) -> list[Any]:
            return list(cursor.execute(SQLITE_LEASES if include_inactive else SQLITE_LEASES_HELD))

        rows = self._pools.run(pg, sqlite, None, renewal=False, write=False)
        infos = [
            LeaseInfo(
                key=key,
                state=_state(state),
                owner=owner,
                holder=holder,
                fencing_token=int(token),
                acquired_at=_datetime(acquired_at),
                expires_in=None if state == "released" else datetime.timedelta(milliseconds=ms),
            )
            for key, owner, holder, token, acquired_at, state, ms in rows
        ]
        return sorted(infos, key=lambda info: (info.state != "held", info.key))

    def clear(self) -> None:
        self._update(PG_CLEAR, SQLITE_CLEAR, (), None)

    def warp(self, delta_ms: int) -> None:
        def pg(cursor: Any) -> None:
            cursor.execute(PG_WARP, (delta_ms,))

        def sqlite(cursor: Any) -> None:
            cursor.execute(SQLITE_WARP, (f"-{delta_ms / 1000:.3f} seconds",))

        self._pools.run(pg, sqlite, None, renewal=False)

    def force_release(self, key: str) -> bool:
        return self._update(PG_FORCE_RELEASE, SQLITE_FORCE_RELEASE, (key,), None) == 1

    def wait_for_release(self, key: str, timeout: float) -> bool:
        """PostgreSQL only, with ``listen_using`` set: woken by the ``NOTIFY`` of a release."""
        if self.listen_using is None or connections[self.using].vendor != "postgresql":
            raise NotImplementedError
        listener = self._listener
        if listener is None or listener.pid != os.getpid():
            listener = self._listener = Listener(self.listen_using, self.timeout)
        return listener.wait(key, timeout)

    def _update(
        self, pg_sql: str, sqlite_sql: str, params: tuple[Any, ...], timeout: float | None
    ) -> int:
        def pg(cursor: Any) -> int:
            cursor.execute(pg_sql, params)
            return int(cursor.rowcount)

        def sqlite(cursor: Any) -> int:
            cursor.execute(sqlite_sql, params)
            return int(cursor.rowcount)

        return self._pools.run(pg, sqlite, timeout, renewal=False)

    # Life cycle and diagnostics.

    def close(self) -> None:
        self._pools.close()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[Any]:
        using = options.get("using", DEFAULT_DB_ALIAS)
        return _configuration_messages(using) if isinstance(using, str) else []

    def check(self, *, databases: Iterable[str] | None = None, deploy: bool = False) -> list[Any]:
        messages = _configuration_messages(self.using)
        if messages:
            return messages
        vendor = connections[self.using].vendor
        from django_locks.conf import configured_debug  # conf imports the stores' base

        if vendor == "sqlite" and not configured_debug():
            messages.append(
                checks.Warning(
                    f"The lock store uses the SQLite database {self.using!r}: it only shares "
                    "locks between the processes of one machine.",
                    hint="Use PostgreSQL (or the RedisStore) when the project runs on more than "
                    "one machine; silence django_locks.W101 if it never does.",
                    id="django_locks.W101",
                )
            )
        if deploy or (databases is not None and self.using in databases):
            messages.extend(self._check_schema())
        return messages

    def _check_schema(self) -> list[Any]:
        # Only a schema that should be there and is not is worth a warning: while django_locks'
        # migrations are not applied on this alias (the first `migrate`, which runs the checks
        # before it migrates), Django's own unapplied-migrations notice covers it.
        def pg(cursor: Any) -> list[str]:
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

        def sqlite(cursor: Any) -> list[str]:
            found = {row[0] for row in cursor.execute(SQLITE_TABLES, (TABLE, SEQUENCE, RECORDER))}
            missing = [name for name in (TABLE, SEQUENCE) if name not in found]
            if not missing or RECORDER not in found:
                return []
            return missing if cursor.execute(MIGRATED).fetchone() else []

        try:
            missing = self._pools.run(pg, sqlite, CHECK_TIMEOUT, renewal=False, write=False)
        except StoreError as exc:
            return [
                checks.Warning(
                    f"The lock store could not reach the database {self.using!r}: {exc}",
                    hint="Check that the database is up and reachable from here.",
                    id="django_locks.W103",
                )
            ]
        if not missing:
            return []
        return [
            checks.Warning(
                f"The lock store's {' and '.join(missing)} "
                f"{'is' if missing == [TABLE] or missing == [SEQUENCE] else 'are'} "
                f"missing from the database {self.using!r}, although its migrations are "
                "recorded as applied (a restored dump, a dropped table).",
                hint=_repair_hint(missing, self.using, connections[self.using].vendor),
                id="django_locks.W102",
            )
        ]


def _repair_hint(missing: list[str], using: str, vendor: str) -> str:
    """How to bring back what W102 found missing: a plain `migrate` answers "No migrations to
    apply", since Django's records say they ran. Each way keeps every key's fencing token growing
    (the rows, where they survive, are the floor of every new token)."""
    database = f" --database {using}"
    if TABLE in missing:
        # The table is gone, so there is nothing to keep: run every migration again (the token
        # source is created only if it is missing, the SQL functions are replaced).
        return (
            f"Run `manage.py migrate django_locks zero --fake{database}`, then "
            f"`manage.py migrate django_locks{database}`."
        )
    if SEQUENCE in missing:
        create = (
            f"CREATE SEQUENCE {SEQUENCE} AS bigint CACHE 1;"
            if vendor == "postgresql"
            else f"CREATE TABLE {SEQUENCE} (id integer NOT NULL PRIMARY KEY CHECK (id = 1), "
            f"value integer NOT NULL); INSERT INTO {SEQUENCE} VALUES (1, (SELECT "
            f"coalesce(max(fencing_token), 0) FROM {TABLE}));"
        )
        return f"In `manage.py dbshell{database}`, run `{create}`"
    return (
        f"Run `manage.py migrate django_locks 0001 --fake{database}`, then "
        f"`manage.py migrate django_locks{database}`: this creates the SQL functions again."
    )


def _configuration_messages(using: str) -> list[Any]:
    """E101 (unknown alias), E102 (unsupported vendor): no I/O."""
    try:
        vendor = connections[using].vendor
    except ConnectionDoesNotExist:
        return [
            checks.Error(
                f"The lock store's database alias {using!r} is not in DATABASES.",
                hint="Set LOCKS['OPTIONS']['using'] to one of: "
                f"{', '.join(map(repr, connections))}.",
                id="django_locks.E101",
            )
        ]
    if vendor not in SUPPORTED_VENDORS:
        return [
            checks.Error(
                f"The lock store cannot use the {vendor} database {using!r}: DatabaseStore "
                "supports PostgreSQL, and SQLite on one machine.",
                hint="Point LOCKS['OPTIONS']['using'] at a PostgreSQL database, or use "
                "'django_locks.stores.RedisStore'.",
                id="django_locks.E102",
            )
        ]
    return []


def _state(value: str) -> LeaseState:
    if value == "held":
        return "held"
    if value == "expired":
        return "expired"
    return "released"


def _datetime(value: Any) -> datetime.datetime | None:
    if value is None:
        return None
    # SQLite keeps Django's text format (parsed by Django's converter, or here); the store
    # writes it from SQLite's 'now', which is UTC.
    parsed = value if isinstance(value, datetime.datetime) else parse_datetime(str(value))
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed


def _sqlite_offset(ttl_ms: int) -> str:
    return f"+{ttl_ms / 1000:.3f} seconds"
