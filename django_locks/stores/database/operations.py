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

from django_locks.stores.base import LeaseInfo, LeaseState

if TYPE_CHECKING:
    from django_locks.stores.database.connections import StoreConnection

T = TypeVar("T")

TABLE = "django_locks_lease"
SEQUENCE = "django_locks_lease_fencing_token_seq"
RECORDER = "django_migrations"
FUNCTIONS_MIGRATION = "0002_sql_functions"
MIGRATED = f"SELECT name FROM {RECORDER} WHERE app = 'django_locks'"

LeaseRow = tuple[Any, ...]
"""A row of a dialect's lease listing: key, owner, holder, token, acquired_at, state, ms left."""


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

    # The contract, one method per operation.

    def acquire(self, cursor: Any, key: str, owner: str, holder: str, ttl_ms: int) -> int | None:
        raise NotImplementedError

    def renew(self, cursor: Any, key: str, owner: str, ttl_ms: int) -> bool:
        raise NotImplementedError

    def renew_many(
        self, cursor: Any, leases: Sequence[tuple[str, str, int]]
    ) -> set[tuple[str, str]]:
        """The ``(key, owner)`` of the leases renewed."""
        raise NotImplementedError

    def release(self, cursor: Any, key: str, owner: str) -> bool:
        raise NotImplementedError

    def force_release(self, cursor: Any, key: str) -> int:
        raise NotImplementedError

    def clear(self, cursor: Any) -> int:
        raise NotImplementedError

    def warp(self, cursor: Any, delta_ms: int) -> None:
        raise NotImplementedError

    def leases(self, cursor: Any, include_inactive: bool) -> list[LeaseRow]:
        raise NotImplementedError

    def lease(self, cursor: Any, key: str, include_inactive: bool) -> LeaseRow | None:
        raise NotImplementedError

    def prune(self, cursor: Any, older_than_ms: int, limit: int) -> tuple[int, bool]:
        """Delete up to ``limit`` rows of leases that ended more than ``older_than_ms`` ago,
        raising the token source to their tokens first; ``(deleted, whether more may be left)``.
        """
        raise NotImplementedError

    def count_prunable(self, cursor: Any, older_than_ms: int) -> int:
        raise NotImplementedError

    def missing_schema(self, cursor: Any) -> list[str]:
        """What of the store's schema is missing although its migrations are recorded."""
        raise NotImplementedError


def lease_info(row: LeaseRow) -> LeaseInfo:
    """A row of a dialect's listing as the contract's ``LeaseInfo``."""
    key, owner, holder, token, acquired_at, state, ms = row
    return LeaseInfo(
        key=key,
        state=_state(state),
        owner=owner,
        holder=holder,
        fencing_token=int(token),
        acquired_at=_datetime(acquired_at),
        expires_in=None if state == "released" else datetime.timedelta(milliseconds=ms),
    )


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
