"""What the database store's two dialects share: the schema's names and the operations' interface.

``DatabaseStore`` (``store.py``) states each operation once and runs it through the dialect of
its alias's vendor, ``postgresql.py`` or ``sqlite.py``, as Django keeps vendor SQL in each
backend's ``connection.ops``. A dialect holds its vendor's SQL, built once at import, and one
method per operation that runs it on a cursor of the store's own connection (``connections.py``
gets the connection, bounds the call and translates its errors).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.utils.dateparse import parse_datetime

from django_locks.holders import Holder
from django_locks.stores.base import (
    EndReason,
    LeaseInfo,
    LeaseState,
    LeaveReason,
    PermitGrant,
    ReleaseReason,
    Renewed,
)

if TYPE_CHECKING:
    from django_locks.stores.database.connections import StoreConnection

T = TypeVar("T")

TABLE = "django_locks_lease"
SEQUENCE = "django_locks_lease_fencing_token_seq"
RECORDER = "django_migrations"
FUNCTIONS_MIGRATION = "0002_sql_functions"
HOLDERS_MIGRATION = "0003_holders_and_ends"
PERMITS_MIGRATION = "0005_permit_functions"
PREEMPT_MIGRATION = "0006_preempt"
TICKS_MIGRATION = "0007_ticks"
ATOMIC_MIGRATION = "0008_atomic_guard"
MIGRATED = f"SELECT name FROM {RECORDER} WHERE app = 'django_locks'"

HOLDER_COLUMNS = (
    "holder_kind",
    "holder_detail",
    "described_token",
    "renewed_at",
    "end_reason",
    "ended_by",
)
"""The columns migration 0003 adds (all nullable: a 0.1.0 process writes none of them)."""
PREEMPT_COLUMNS = ("preempt_token",)
"""The column migration 0006 adds (nullable too)."""
TICK_COLUMNS = ("tick_ms", "tick_token")
"""The columns migration 0007 adds (nullable too), the key's tick record."""
ADDED_COLUMNS = (*HOLDER_COLUMNS, *PREEMPT_COLUMNS, *TICK_COLUMNS)
"""The columns of 0003, 0006 and 0007 (W102 names those missing; a call meeting one missing
says to migrate)."""

FUNCTIONS = {
    FUNCTIONS_MIGRATION: (
        "django_locks_acquire(text, text, text, bigint)",
        "django_locks_release(text, text)",
    ),
    HOLDERS_MIGRATION: (
        "django_locks_acquire_as(text, text, text, text, text, bigint)",
        "django_locks_end(text, text, text)",
    ),
    PERMITS_MIGRATION: (
        "django_locks_acquire_plain(text, text, text, text, text, bigint)",
        "django_locks_acquire_permit(text, text, text, text, text, bigint, integer)",
        "django_locks_renew_slots(text[], text[], bigint[], text[], text)",
        "django_locks_end_slot(text, text, text, text, text)",
        "django_locks_force_end(text, text)",
    ),
    PREEMPT_MIGRATION: (
        "django_locks_acquire_lease(text, text, text, text, text, bigint)",
        "django_locks_acquire_slot(text, text, text, text, text, bigint, integer)",
        "django_locks_renew(text, text, bigint)",
        "django_locks_renew_permits(text[], text[], bigint[], text[])",
        "django_locks_preempt(text)",
    ),
    ATOMIC_MIGRATION: ("django_locks_atomic_check()",),  # lock.atomic()'s trigger function
}
"""The store's SQL functions on PostgreSQL (their signatures), by the migration creating them:
0.1.0 processes call 0002's; this release 0006's, and 0003's and 0005's for what 0006 left
as it was (its releases, a leave) or where 0006's are missing."""

LeaseRow = tuple[Any, ...]
"""A row of a dialect's lease listing: key, owner, holder, token, acquired_at, state, ms left,
expires_at, whether the 0003 columns describe this lease, holder_kind, holder_detail,
renewed_at, end_reason, ended_by; then, from a dialect offering permits, the row's permit (a
slot's n) and permits (a slot's, and its key's own record's)."""

HolderRow = tuple[Any, ...]
"""What a dialect reads of the lease that refused an acquire: holder (``host:pid``), kind,
detail (None when unknown), acquired_at, expires_at."""


class Operations:
    """One vendor's SQL for every operation of the store (a dialect), for one alias.

    Each method takes the cursor of a connection the store checked out and runs ONE step of
    the contract on it (one statement on PostgreSQL; one ``BEGIN IMMEDIATE`` transaction on
    SQLite, which :meth:`run` opens).
    """

    vendor = ""
    recreate_sequence = ""
    """The SQL that brings a lost token source back, for the W102 hint."""

    def __init__(self, using: str) -> None:
        self.using = using

    # How a call runs on a connection.

    def run(
        self,
        conn: StoreConnection,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        deadline: float,
        write: bool,
        busy_wait: float | None,
    ) -> T:
        """``fn(cursor, *args)`` on ``conn``: as one atomic step when ``write``."""
        raise NotImplementedError

    def in_memory(self) -> bool:
        """Whether the alias is an in-memory database only Django's own connection reaches."""
        return False

    def own_transaction(self, *, renewal: bool, write: bool) -> Any:
        """This thread's open transaction that a call of the store must not wait on, or None."""
        return None

    def missing_table(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the store's table is not in the database (not migrated)."""
        return False

    def missing_column(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a column of the store's table is not there (0003 not migrated)."""
        return False

    # The contract, one method per operation.

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
        """The token when taken, else what is known of the holder (None: nothing)."""
        raise NotImplementedError

    def renew(self, cursor: Any, key: str, owner: str, ttl_ms: int) -> Renewed:
        raise NotImplementedError

    def renew_many(
        self, cursor: Any, leases: Sequence[tuple[str, str, int]]
    ) -> dict[tuple[str, str], Renewed]:
        """The answer of each ``(key, owner)`` renewed or preempted (one missing: refused)."""
        raise NotImplementedError

    def preempt(self, cursor: Any, key: str) -> int | None:
        """The token of the live lease now asked to give ``key`` up, None (nothing written)."""
        raise NotImplementedError

    def leave(self, cursor: Any, key: str, owner: str, ttl_ms: int, how: LeaveReason) -> bool:
        raise NotImplementedError

    def record_tick(self, cursor: Any, key: str, owner: str, tick_ms: int) -> bool:
        """Whether ``tick_ms`` was recorded, with the token of ``owner``'s live plain lease on
        ``key`` (one statement, judged by the renewals' rule); nothing written otherwise."""
        raise NotImplementedError

    def recorded_tick(self, cursor: Any, key: str) -> tuple[int, int] | None:
        """The tick record of ``key``'s row, ``(tick_ms, tick_token)``, or None."""
        raise NotImplementedError

    supports_permits = False
    """Whether the dialect offers permits (``acquire_permit`` and the ``Slot`` rules of the
    other operations, which are given the ``Slot`` itself as their key)."""

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
        """The grant when a slot was taken, else what is known of the holder whose slot ends
        first (None: nothing); raises ``PermitsMismatchError``, nothing written."""
        raise NotImplementedError

    def end(self, cursor: Any, key: str, owner: str, how: ReleaseReason) -> bool:
        raise NotImplementedError

    def force_end(self, cursor: Any, key: str, by: str | None) -> int:
        raise NotImplementedError

    def clear(self, cursor: Any) -> int:
        raise NotImplementedError

    def warp(self, cursor: Any, delta_ms: int) -> None:
        raise NotImplementedError

    def leases(self, cursor: Any, include_inactive: bool) -> list[LeaseRow]:
        raise NotImplementedError

    def lease(self, cursor: Any, key: str, include_inactive: bool) -> LeaseRow | None:
        raise NotImplementedError

    def prune(
        self, cursor: Any, older_than_ms: int, limit: int, prefix: str = ""
    ) -> tuple[int, bool]:
        """Delete up to ``limit`` rows of leases that ended more than ``older_than_ms`` ago
        (with ``prefix``, only rows whose key starts with it), raising the token source to
        their tokens first; ``(deleted, whether more may be left)``.
        """
        raise NotImplementedError

    def count_prunable(self, cursor: Any, older_than_ms: int, prefix: str = "") -> int:
        raise NotImplementedError

    def missing_schema(self, cursor: Any) -> list[str]:
        """What of the store's schema is missing although its migrations are recorded."""
        raise NotImplementedError


def schema_missing(
    applied: set[str],
    *,
    table: bool,
    sequence: bool,
    columns: set[str] | None,
    functions: set[str],
) -> list[str]:
    """What of the store's schema is missing although the migration making it is recorded in
    ``applied``: the table, the token source, 0003's, 0006's and 0007's columns and the SQL
    functions (of ``functions``, the signatures missing), each by its name. ``columns``: those
    the table has (None when it is missing)."""
    if not applied:
        return []
    missing = [name for name, gone in ((TABLE, table), (SEQUENCE, sequence)) if gone]
    if columns is not None and HOLDERS_MIGRATION in applied:
        missing += [column for column in HOLDER_COLUMNS if column not in columns]
    if columns is not None and PREEMPT_MIGRATION in applied:
        missing += [column for column in PREEMPT_COLUMNS if column not in columns]
    if columns is not None and TICKS_MIGRATION in applied:
        missing += [column for column in TICK_COLUMNS if column not in columns]
    for migration, signatures in FUNCTIONS.items():
        if migration in applied:
            missing += [sig.partition("(")[0] for sig in signatures if sig in functions]
    return missing


def lease_info(row: LeaseRow) -> LeaseInfo:
    """A row of a dialect's listing as the contract's ``LeaseInfo``."""
    key, owner, address, token, acquired_at, state, ms, expires_at, described, *columns = row
    permit, permits = columns[5:7] if len(columns) > 5 else (None, None)
    kind, detail, renewed_at, end_reason, ended_by = columns[:5] if described else (None,) * 5
    since = _datetime(acquired_at)
    holder = Holder.parse(
        address, kind=kind, detail=detail, since=since, expires_at=_datetime(expires_at)
    )
    lease_state = _state(state)
    return LeaseInfo(
        key=key,
        state=lease_state,
        owner=owner,
        holder=str(holder),
        fencing_token=int(token),
        acquired_at=since,
        expires_in=None if lease_state == "released" else datetime.timedelta(milliseconds=ms),
        holder_info=holder,
        ended=ended(lease_state, bool(described), end_reason),
        ended_by=ended_by,
        last_renewed=_datetime(renewed_at),
        permit=None if permit is None else int(permit),
        permits=None if permits is None else int(permits),
    )


def holder_of(row: HolderRow) -> Holder:
    """The holder a dialect read for a refused acquire."""
    address, kind, detail, acquired_at, expires_at = row
    return Holder.parse(
        address,
        kind=kind,
        detail=detail,
        since=_datetime(acquired_at),
        expires_at=_datetime(expires_at),
    )


_ENDS: dict[str, EndReason] = {
    reason: reason
    for reason in ("released", "handed back", "lapsed", "expired", "force released", "max hold")
}


def ended(state: LeaseState, described: bool, end_reason: str | None) -> EndReason | None:
    """How a lease of ``state`` ended (SPEC section 8), from its row's ``end_reason`` (for a
    lease still held, how it will end once left to lapse). ``described``: whether the row's
    0003 columns describe this lease; not for a lease a 0.1.0 process took, which recorded no
    end (SPEC section 9: held / expired with no end reason)."""
    if state == "held" or not described:
        return None
    reason = _ENDS.get(end_reason) if end_reason is not None else None
    if state == "expired":
        return reason if reason in ("lapsed", "handed back", "max hold") else "expired"
    # Released with no reason, or with only a leave's "lapsed" or "max hold" (how it would have
    # ended, had it run out): a 0.1.0 process ended it.
    return None if reason in ("lapsed", "max hold") else reason


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
