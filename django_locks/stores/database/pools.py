"""The database store's connections of one process: per thread or pooled, borrowed in tests.

Each call of ``DatabaseStore`` checks a connection out (the calling thread's own, or one of
``max_connections`` shared ones; always the thread's own for renewals, so requests cannot starve
the renewer), runs one dialect method on it under the watchdog's deadline (``stores/runtime.py``:
never enforced by the thread doing the I/O), translates the driver's errors, and gives the
connection back, or discards it when the call failed or was abandoned. The connections of a
process are a ``ProcessLocal``: a forked child starts afresh and never uses or closes its
parent's.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections
from django.db.utils import Error as DjangoDatabaseError

from django_locks import process
from django_locks.exceptions import (
    OwnTransactionError,
    PermitsMismatchError,
    StoreError,
    StoreTimeoutError,
)
from django_locks.stores.database.connections import ConnectAttempt, PrivateBackend, StoreConnection
from django_locks.stores.database.operations import Operations
from django_locks.stores.database.postgresql import PostgreSQLOperations
from django_locks.stores.database.sqlite import SQLiteOperations
from django_locks.stores.database.sqlite_atomic import OwnTransaction, testcase_open
from django_locks.stores.runtime import ProcessLocal, translated, watchdog

if TYPE_CHECKING:
    from django_locks.stores.database.store import DatabaseStore

T = TypeVar("T")

DIALECTS: dict[str, type[Operations]] = {
    "postgresql": PostgreSQLOperations,
    "sqlite": SQLiteOperations,
}
"""The vendors the store supports, and the dialect of each."""


class _ProcessState:
    """The connections one store opened in this process (a forked child starts afresh)."""

    def __init__(self) -> None:
        self.pid = process.pid()
        self.lock = threading.Lock()
        self.local = threading.local()
        self.conns: set[StoreConnection] = set()
        self.idle: list[StoreConnection] = []
        self.slots: threading.BoundedSemaphore | None = None
        self.shared: StoreConnection | None = None  # SQLite in memory: Django's connection
        self.shared_lock = threading.Lock()
        # SQLite file inside a TestCase: the test's connection (its wrapper, and ours of it).
        self.borrowed: tuple[Any, StoreConnection] | None = None


class Pools:
    """The connections of one ``DatabaseStore``: how calls get one, run, and give it back."""

    def __init__(self, store: DatabaseStore) -> None:
        self.using = store.using
        self.what = f"the database {store.using!r}"
        self.default_timeout = store.timeout
        self.max_connections = store.max_connections
        # In a forked child the parent's connections are kept referenced forever, never closed
        # (closing would end the parent's sessions), and never used.
        self._state: ProcessLocal[_ProcessState] = ProcessLocal(_ProcessState)
        self._ops: Operations | None = None
        self.errors: tuple[type[BaseException], ...] = (DjangoDatabaseError, OSError)

    @property
    def state(self) -> _ProcessState:
        return self._state.get()

    @property
    def ops(self) -> Operations:
        """The dialect of the alias's vendor (known on first use: settings may change before)."""
        ops = self._ops
        if ops is None:
            wrapper: Any = connections[self.using]
            self.errors = (DjangoDatabaseError, OSError, wrapper.Database.Error)
            ops = self._ops = DIALECTS[wrapper.vendor](self.using)
        return ops

    def run(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        timeout: float | None,
        *,
        renewal: bool,
        write: bool = True,
    ) -> T:
        """``fn(cursor, *args)`` (a dialect's method) on a connection, within ``timeout``
        seconds (the store's default when None)."""
        seconds = self.default_timeout if timeout is None else timeout
        if seconds <= 0:
            raise StoreTimeoutError(f"No time left for a call to the database {self.using!r}.")
        deadline = time.monotonic() + seconds
        state = self._state.get()
        ops = self.ops
        own = ops.own_transaction(renewal=renewal, write=write)
        if own is not None and own.testcase:
            conn = self._checkout_borrowed(state, own.wrapper, deadline)
            own = None
        else:
            conn = self._checkout(state, deadline, renewal)
        try:
            result = self._execute(conn, ops, fn, args, deadline, seconds, write, own)
        except OwnTransactionError:
            # Refused, not broken: its transaction was rolled back, the connection is reusable.
            self._give_back(state, conn, renewal, broken=conn.raw.in_transaction)
            raise
        except PermitsMismatchError:
            # Refused by what the step read, before it wrote anything: the connection is fine.
            self._give_back(state, conn, renewal, broken=conn.fired)
            raise
        except BaseException:
            self._give_back(state, conn, renewal, broken=True)
            raise
        self._give_back(state, conn, renewal, broken=conn.fired)
        return result

    def _execute(
        self,
        conn: StoreConnection,
        ops: Operations,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        deadline: float,
        seconds: float,
        write: bool,
        own: OwnTransaction | None,
    ) -> T:
        # The watchdog's calls rather than runtime.deadline() / translate() as context managers:
        # this is every acquire's and release's path, and the errors are translated the same.
        dog = watchdog()
        dog.watch(conn, deadline)
        try:
            return ops.run(conn, fn, args, deadline, write, None if own is None else own.busy_wait)
        except self.errors as exc:
            refusal = None if own is None or conn.fired else own.refusal(self.using, exc)
            if refusal is not None:
                raise refusal from exc
            raise translated(
                exc, self.what, timed_out=dog.unwatch(conn), timeout=seconds, hint=self._hint(exc)
            ) from exc
        finally:
            dog.unwatch(conn)

    def _hint(self, exc: BaseException) -> str:
        """The fix, for the failures that have one: the store's table is not there yet."""
        if self.ops.missing_table(exc):
            return (
                f" The lock store's table is missing from the database {self.using!r}: run "
                f"`manage.py migrate django_locks --database {self.using}` (with "
                "'django_locks' in INSTALLED_APPS, which the migration needs)."
            )
        if self.ops.missing_column(exc):
            return (
                f" The lock store's table in the database {self.using!r} lacks the columns of "
                "this release's migrations (0003_holders_and_ends, 0004_permits, 0006_preempt, "
                f"0007_ticks): run `manage.py migrate django_locks --database {self.using}`."
            )
        return ""

    # Getting a connection and giving it back.

    def _checkout(self, state: _ProcessState, deadline: float, renewal: bool) -> StoreConnection:
        if self.ops.in_memory():
            return self._checkout_shared(state, deadline)
        borrowed = self._borrowed_elsewhere(state, deadline)
        if borrowed is not None:
            return borrowed
        if self.max_connections is None or renewal:
            with state.lock:
                conn: StoreConnection | None = getattr(state.local, "conn", None)
                if conn is not None and not (conn.closed or conn.close_requested):
                    conn.busy = True
                    return conn
            conn = self._connect(state, deadline)
            state.local.conn = conn
            return conn
        if state.slots is None:
            with state.lock:
                if state.slots is None:
                    state.slots = threading.BoundedSemaphore(self.max_connections)
        if not state.slots.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise StoreTimeoutError(
                f"None of the {self.max_connections} connections of the lock store to the "
                f"database {self.using!r} became free before the call's timeout."
            )
        with state.lock:
            while state.idle:
                conn = state.idle.pop()
                if not (conn.closed or conn.close_requested):
                    conn.busy = True
                    return conn
        try:
            return self._connect(state, deadline)
        except BaseException:
            state.slots.release()
            raise

    def _give_back(
        self, state: _ProcessState, conn: StoreConnection, renewal: bool, *, broken: bool
    ) -> None:
        if not conn.owned:
            if broken:
                state.shared = None
                state.borrowed = None
            state.shared_lock.release()
            return
        pooled = self.max_connections is not None and not renewal
        with state.lock:
            conn.busy = False
            usable = not (broken or conn.close_requested or conn.closed)
            keep = usable and state.pid == process.pid()
            if not keep:
                state.conns.discard(conn)
            elif pooled:
                state.idle.append(conn)
        if pooled and state.slots is not None:
            state.slots.release()
        if not keep:
            if getattr(state.local, "conn", None) is conn:
                state.local.conn = None
            conn.discard()

    def _checkout_shared(self, state: _ProcessState, deadline: float) -> StoreConnection:
        # SQLite's in-memory test database lives as long as Django's connection to it, and a
        # second connection to its shared cache finds tables locked: use Django's connection,
        # one call at a time.
        if not state.shared_lock.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise StoreTimeoutError(f"The SQLite database {self.using!r} stayed busy.")
        try:
            wrapper = connections[self.using]
            name = wrapper.settings_dict["NAME"]
            shared = state.shared
            if shared is None or shared.name != name:
                wrapper.ensure_connection()
                shared = StoreConnection(wrapper.connection, vendor="sqlite", owned=False)
                shared.name = name
                state.shared = shared
            return shared
        except BaseException:
            state.shared_lock.release()
            raise

    def _checkout_borrowed(
        self, state: _ProcessState, wrapper: Any, deadline: float
    ) -> StoreConnection:
        # Inside a TestCase on a SQLite file the test's transaction may hold the write lock,
        # and what it wrote is seen only through its connection (SPEC section 7): the store
        # writes through that connection, one call at a time (the renewer's too, see below).
        if not state.shared_lock.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise StoreTimeoutError(f"The SQLite database {self.using!r} stayed busy.")
        try:
            borrowed = state.borrowed
            if (
                borrowed is None
                or borrowed[0] is not wrapper
                or borrowed[1].raw is not wrapper.connection
            ):
                conn = StoreConnection(wrapper.connection, vendor="sqlite", owned=False)
                conn.name = wrapper.settings_dict["NAME"]
                borrowed = state.borrowed = (wrapper, conn)
            return borrowed[1]
        except BaseException:
            state.shared_lock.release()
            raise

    def _borrowed_elsewhere(self, state: _ProcessState, deadline: float) -> StoreConnection | None:
        """The test's connection, for the other threads (the renewer) while its TestCase
        transaction is open; None (and forgotten) once it is not."""
        borrowed = state.borrowed
        if borrowed is None:
            return None
        wrapper, conn = borrowed
        if testcase_open(wrapper) and wrapper.connection is conn.raw:
            return self._checkout_borrowed(state, wrapper, deadline)
        state.borrowed = None
        return None

    def _connect(self, state: _ProcessState, deadline: float) -> StoreConnection:
        # An attempt abandoned at the call's deadline still ends soon (libpq's own timeout),
        # instead of keeping its thread and socket for the system's TCP timeout.
        defaults = (
            {"connect_timeout": max(2, math.ceil(self.default_timeout))}
            if self.ops.vendor == "postgresql"
            else {}
        )
        backend = PrivateBackend(self.using, **defaults)
        attempt = ConnectAttempt(backend)
        # Connecting runs on a thread of its own so that a server that does not answer costs
        # the caller no more than its timeout; a connection completed too late is closed.
        threading.Thread(target=attempt.run, name="django_locks-connect", daemon=True).start()
        if not attempt.done.wait(max(deadline - time.monotonic(), 0)) and attempt.abandon():
            raise StoreTimeoutError(
                f"Connecting to the database {self.using!r} took longer than the call's timeout."
            )
        if attempt.error is not None:
            if isinstance(attempt.error, self.errors):
                raise StoreError(
                    f"The lock store could not connect to the database {self.using!r}: "
                    f"{attempt.error}"
                ) from attempt.error
            raise attempt.error
        conn = StoreConnection(attempt.raw, vendor=self.ops.vendor, owned=True)
        conn.name = backend.settings_dict["NAME"]
        conn.busy = True
        with state.lock:
            # The per-thread connections of threads that ended are closed here rather than left
            # to the GC. Not an idle pooled one: it belongs to no thread, and another thread
            # may take it from the pool at any moment.
            idle = set(state.idle)
            dead = [
                c for c in state.conns if not c.busy and not c.thread.is_alive() and c not in idle
            ]
            state.conns.difference_update(dead)
            state.conns.add(conn)
        for old in dead:
            old.close()
        return conn

    # Life cycle.

    def close(self) -> None:
        state = self._state.peek()
        if state is None:
            return  # none opened here (a forked child never closes its parent's)
        with state.lock:
            to_close = [conn for conn in state.conns if not conn.busy]
            for conn in state.conns:
                conn.close_requested = True  # a busy one is closed by its thread, after its call
            state.conns.clear()
            state.idle.clear()
            state.shared = None
        for conn in to_close:
            conn.close()
