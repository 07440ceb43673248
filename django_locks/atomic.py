"""``lock.atomic()``: a transaction on the lock store's own database whose commit is conditional
on the lease (SPEC section 13, promise P6).

Every write the block makes on that alias commits before any next holder of the key acquires
it, or not at all (``LockLostError``, rolled back). The block adds one statement at its start
and one before its COMMIT, no commit of its own; the SQL and its reasons are in
``stores/database/atomic_sql.py``. Under a ``TestCase``'s wrapping transaction (nothing can
commit there) the block is a savepoint and its check a plain read of the lease.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, transaction
from django.db.transaction import TransactionManagementError

from django_locks.exceptions import LockReleasedError
from django_locks.stores.database.atomic_sql import (
    LOST_SQLSTATE,
    PG_ATOMIC_END,
    PG_ATOMIC_LIVE,
    PG_ATOMIC_START,
    SQLITE_ATOMIC_CHECK,
    SQLITE_ATOMIC_LIVE,
)
from django_locks.stores.database.operations import ATOMIC_MIGRATION
from django_locks.stores.database.sqlite_atomic import transaction_mode
from django_locks.stores.database.sqlite_sql import offset
from django_locks.transactions import testcase_only

if TYPE_CHECKING:
    from django_locks.lock import Lock
    from django_locks.renewal import Keeper

ACCEPTED_ISOLATION = "read committed"
UNDEFINED_TABLE = "42P01"
MAX_TIMEOUT_MS = 2_147_483_647
"""PostgreSQL's largest timeout setting (about 24.8 days): a longer ttl bounds the block by it."""


class LeaseAtomic:
    """What :meth:`Lock.atomic` returns: a context manager (sync only) around one outermost
    ``transaction.atomic()`` on the store's alias, committed only while the lease is this
    lock's. Entered once; yields the lock."""

    __slots__ = ("_alias", "_atomic", "_entered", "_lock", "_savepoint", "_sent", "_vendor")

    def __init__(self, lock: Lock, using: str | None = None) -> None:
        self._lock = lock
        self._alias = _check_using(lock, using)
        self._vendor: str = connections[self._alias].vendor
        self._atomic: Any = None
        self._entered = False
        self._savepoint = False  # inside a TestCase's wrapping transaction
        self._sent: float | None = None  # when SQLite's check that extended the lease was sent

    @property
    def _keeper(self) -> Keeper:
        return self._lock._keeper

    def __enter__(self) -> Lock:
        if self._entered:
            raise RuntimeError("A lock.atomic() block can be entered once; call atomic() again.")
        self._entered = True
        conn = connections[self._alias]
        if conn.in_atomic_block:
            if not testcase_only(conn):
                raise TransactionManagementError(_nested(self._lock.key, conn))
            self._savepoint = True
        if self._vendor == "sqlite":
            _check_immediate(conn)
        self._still_held()
        self._atomic = transaction.atomic(using=self._alias)
        self._atomic.__enter__()
        if self._vendor == "postgresql" and not self._savepoint:
            try:
                self._start(conn)
            except BaseException as error:
                self._atomic.__exit__(*sys.exc_info())
                if isinstance(error, DatabaseError) and _sqlstate(error) == UNDEFINED_TABLE:
                    raise ImproperlyConfigured(
                        f"lock.atomic() needs django_locks' migration {ATOMIC_MIGRATION} on "
                        f"the database {self._alias!r}: run `manage.py migrate django_locks "
                        f"--database {self._alias}` (where it says there is nothing to apply, "
                        "the guard was lost, e.g. by a restored dump: run `manage.py migrate "
                        f"django_locks 0007 --database {self._alias}` and then that command)."
                    ) from error
                raise
        return self._lock

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        atomic = self._atomic
        if exc_type is not None:
            atomic.__exit__(exc_type, exc, tb)  # rolled back; the block's exception goes on
            return
        try:
            self._still_held()
            self._before_commit(connections[self._alias])
        except BaseException:
            atomic.__exit__(*sys.exc_info())
            raise
        try:
            atomic.__exit__(None, None, None)  # COMMIT (the trigger's check, on PostgreSQL)
        except DatabaseError as error:
            if _sqlstate(error) == LOST_SQLSTATE:
                raise self._lost() from error
            raise  # a COMMIT whose answer was lost: Django's error, unchanged
        if self._sent is not None:
            self._keeper.check_passed(self._sent)

    def _start(self, conn: Any) -> None:
        keeper = self._keeper
        bound = min(keeper.ttl_ms, MAX_TIMEOUT_MS)
        timeout = str(bound)
        with conn.cursor() as cursor:
            cursor.execute(
                PG_ATOMIC_START,
                (keeper.lease_key, keeper.owner, keeper.fencing_token, bound, timeout, timeout),
            )
            (isolation,) = cursor.fetchone()
        if isolation != ACCEPTED_ISOLATION:
            raise TransactionManagementError(
                f"lock.atomic() on {self._lock.key!r} runs at READ COMMITTED only; the "
                f"database {self._alias!r} begins its transactions at {isolation.upper()}, "
                "where the check at COMMIT reads a snapshot older than every renewal since. "
                "Set OPTIONS 'isolation_level' of that alias to READ COMMITTED (the default), "
                "or write with fenced_update() and the lock's fencing token instead."
            )

    def _before_commit(self, conn: Any) -> None:
        keeper = self._keeper
        ident = (keeper.lease_key, keeper.owner, keeper.fencing_token)
        with conn.cursor() as cursor:
            if self._savepoint:
                live = PG_ATOMIC_LIVE if self._vendor == "postgresql" else SQLITE_ATOMIC_LIVE
                cursor.execute(live, ident)
                if cursor.fetchone() is None:
                    raise self._lost()
            elif self._vendor == "postgresql":
                cursor.execute(PG_ATOMIC_END)
            else:
                sent = keeper.clock.monotonic()
                cursor.execute(SQLITE_ATOMIC_CHECK, (offset(keeper.ttl_ms), *ident))
                if cursor.rowcount == 1:
                    self._sent = sent  # extended: a renewal, once committed
                else:
                    cursor.execute(SQLITE_ATOMIC_LIVE, ident)  # asked for, or gone?
                    if cursor.fetchone() is None:
                        raise self._lost()

    def _still_held(self) -> None:
        """Refuse at once what the lock itself knows: released, lost, or past its deadline."""
        keeper = self._keeper
        if keeper.state != "held":
            raise keeper.signal.reason or LockReleasedError(keeper.key, keeper.fencing_token)
        if not keeper.held:
            raise keeper.check_failed("deadline")

    def _lost(self) -> BaseException:
        return self._keeper.check_failed("renewal")


def _check_using(lock: Lock, using: object) -> str:
    """The alias of the block: the lock store's own. ``ValueError`` for any other, and for a
    lock that is not a plain lock of a ``DatabaseStore`` (no I/O)."""
    from django_locks.stores.database import DatabaseStore

    keeper = lock._keeper
    store = keeper.store
    if not isinstance(store, DatabaseStore):
        raise ValueError(
            f"lock.atomic() needs a lock of a DatabaseStore, whose leases live in the database "
            f"the block writes; lock {lock.key!r} is held in {store!r}. Protect writes to "
            "another store's resources with the lock's fencing token (fenced_update())."
        )
    if keeper.permit is not None:
        raise ValueError(
            f"lock.atomic() is refused on a permit (lock {lock.key!r}, permit {keeper.permit}): "
            "its holders are valid at once, so a commit conditional on one of them excludes "
            "nobody. Take a plain lock (permits=1) for the writes that must be exclusive."
        )
    if using is not None and using != store.using:
        raise ValueError(
            f"lock.atomic()'s `using` must be the alias of the lock's store, {store.using!r} "
            f"(where its lease is checked at COMMIT), got {using!r}. Writes to another "
            "database are protected with the lock's fencing token (fenced_update())."
        )
    return store.using


def _check_immediate(conn: Any) -> None:
    mode = transaction_mode(conn.settings_dict)
    if mode not in ("IMMEDIATE", "EXCLUSIVE"):
        raise ImproperlyConfigured(
            f"lock.atomic() on SQLite needs DATABASES[{conn.alias!r}]['OPTIONS']"
            "['transaction_mode'] = 'IMMEDIATE' (Django 5.1+), got "
            f"{mode!r}: the block must hold the file's write lock from its start, or a next "
            "holder could acquire between its check and its COMMIT."
        )


def _nested(key: str, conn: Any) -> str:
    cause = (
        f" The request runs in one (ATOMIC_REQUESTS is on for {conn.alias!r}): decorate the "
        "view with @transaction.non_atomic_requests."
        if conn.settings_dict.get("ATOMIC_REQUESTS")
        else ""
    )
    return (
        f"lock.atomic() on {key!r} must be the outermost atomic block on {conn.alias!r}, and "
        f"this thread is already inside transaction.atomic() there.{cause} A nested block "
        "commits with its outer one, after the check: end the outer transaction first, or "
        "open the transaction with lock.atomic() itself."
    )


def _sqlstate(error: BaseException) -> str | None:
    cause = error.__cause__
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
