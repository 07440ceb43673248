"""The database store's own connections: per thread or pooled, call deadlines, fork safety.

``DatabaseStore`` never uses the connection Django gives a request (its writes would join the
request's transaction). It opens driver connections of its own from the alias's
``settings_dict``, through a private instance of the alias's backend (so psycopg 3, psycopg2,
SQLite, their options and ``connection_created`` receivers all apply), in autocommit.

The stores' watchdog thread (``stores/runtime.py``) enforces every call's deadline; the thread
doing the I/O never does. At the
deadline it shuts the connection's socket down, which wakes the caller at once even when the
server is unreachable, and sends the server a cancel request from a thread of its own so that no
statement keeps running there; the connection is then discarded.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections
from django.db.utils import Error as DjangoDatabaseError

from django_locks.exceptions import OwnTransactionError, StoreError, StoreTimeoutError
from django_locks.stores import runtime
from django_locks.stores.runtime import watchdog

if TYPE_CHECKING:
    from django_locks.stores.database import DatabaseStore

T = TypeVar("T")

logger = logging.getLogger("django_locks")

UNDEFINED_TABLE = "42P01"
"""PostgreSQL's SQLSTATE for a table (or sequence) that does not exist."""

CANCEL_TIMEOUT = 5.0
"""Seconds the cancel request of an abandoned call may take (it runs on a thread of its own)."""

CANCEL_GRACE = 0.02
"""Seconds the watchdog gives the cancel request before it shuts the connection's socket down."""

OWN_LOCK_WAIT = 0.05
"""Seconds a write of the store waits for SQLite's write lock while this thread's own transaction
on the same file is open (it may hold that lock: waiting longer cannot help); 0 when the
transaction certainly holds it (``transaction_mode`` IMMEDIATE or EXCLUSIVE)."""


class StoreConnection:
    """One driver connection of a store (or, for SQLite in memory, Django's own)."""

    def __init__(self, raw: Any, *, vendor: str, owned: bool) -> None:
        self.raw = raw
        self.vendor = vendor
        self.owned = owned
        self.psycopg2 = type(raw).__module__.startswith("psycopg2")
        self.fd = raw.fileno() if vendor == "postgresql" else -1
        self.thread = threading.current_thread()
        self.name = ""  # the database name it was opened on
        self.cursor: Any = None
        self.deadline = math.inf
        self.busy = False
        self.fired = False  # the watchdog abandoned the call running on it
        self.close_requested = False
        self.closed = False
        self._close_lock = threading.Lock()
        self._unsettled = {"call", "cancel", "shutdown"}  # of an abandoned call

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.owned:
            return  # Django's own connection: Django closes it
        with contextlib.suppress(Exception):  # a broken connection may complain; it is gone
            self.raw.close()

    def abandon(self) -> None:
        """Watchdog side, at the deadline, while the call still runs on another thread."""
        self.fired = True
        if self.vendor == "sqlite":
            if self.owned:
                self.raw.interrupt()
            return
        # First the cancel request, from a thread of its own (it is network I/O): the server
        # stops the statement instead of leaving it queued behind a row lock. It must go out
        # before the socket is shut down, since both drivers refuse to cancel on a connection
        # they have seen fail. Then, after a short grace whether or not the cancel got through,
        # the shutdown wakes the caller even when the server does not answer at all.
        sent = threading.Event()
        threading.Thread(
            target=self._cancel, args=(sent,), name="django_locks-cancel", daemon=True
        ).start()
        sent.wait(CANCEL_GRACE)
        try:
            # A socket object of our own on a duplicate descriptor: shutdown() acts on the
            # connection, close() only on the duplicate.
            with socket.socket(fileno=os.dup(self.fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._settled("shutdown")

    def _cancel(self, sent: threading.Event) -> None:
        try:
            if self.psycopg2:
                self.raw.cancel()
            else:
                self.raw.cancel_safe(timeout=CANCEL_TIMEOUT)
        except Exception:  # best effort: the shutdown still ends the call
            pass
        finally:
            sent.set()
        self._settled("cancel")

    def discard(self) -> None:
        """Caller side: never use it again. An abandoned one is closed only once its cancel was
        sent and its socket shut down (closing earlier would free what they still use)."""
        if not self.fired or self.vendor == "sqlite":
            self.close()
        else:
            self._settled("call")

    def _settled(self, party: str) -> None:
        with self._close_lock:
            self._unsettled.discard(party)
            close_now = not self._unsettled
        if close_now:
            self.close()


class _ProcessState:
    """The connections one store opened in this process (a forked child starts afresh)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
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
        self.default_timeout = store.timeout
        self.max_connections = store.max_connections
        self.state = _ProcessState()
        self.vendor = ""
        self.errors: tuple[type[BaseException], ...] = (DjangoDatabaseError, OSError)

    def run(
        self,
        pg: Callable[[Any], T],
        sqlite: Callable[[Any], T],
        timeout: float | None,
        *,
        renewal: bool,
        write: bool = True,
    ) -> T:
        """Run ``pg(cursor)`` or ``sqlite(cursor)`` on a connection, within ``timeout`` seconds."""
        seconds = self.default_timeout if timeout is None else timeout
        if seconds <= 0:
            raise StoreTimeoutError(f"No time left for a call to the database {self.using!r}.")
        deadline = time.monotonic() + seconds
        state = self._current_state()
        self._know_vendor()
        own = None
        if self.vendor == "sqlite" and not _in_memory(self.using):
            own = _own_transaction(self.using)
            if own is not None and not own.testcase and (renewal or not write):
                # The renewer is never refused: a busy file is an error it retries (SPEC 10).
                own = None
        if own is not None and own.testcase:
            conn = self._checkout_borrowed(state, own.wrapper, deadline)
            own = None
        else:
            conn = self._checkout(state, deadline, renewal)
        try:
            result = self._execute(conn, pg, sqlite, deadline, seconds, write, own)
        except OwnTransactionError:
            # Refused, not broken: its transaction was rolled back, the connection is reusable.
            self._give_back(state, conn, renewal, broken=conn.raw.in_transaction)
            raise
        except BaseException:
            self._give_back(state, conn, renewal, broken=True)
            raise
        self._give_back(state, conn, renewal, broken=conn.fired)
        return result

    def _execute(
        self,
        conn: StoreConnection,
        pg: Callable[[Any], T],
        sqlite: Callable[[Any], T],
        deadline: float,
        seconds: float,
        write: bool,
        own: _OwnTransaction | None = None,
    ) -> T:
        watchdog().watch(conn, deadline)
        try:
            if conn.vendor == "postgresql":
                if conn.cursor is None:
                    conn.cursor = conn.raw.cursor()  # one per connection: made once, not per call
                return pg(conn.cursor)
            busy_wait = None if own is None else (0.0 if own.certain else OWN_LOCK_WAIT)
            return _run_sqlite(conn, sqlite, deadline, write, busy_wait)
        except self.errors as exc:
            if own is not None and _sqlite_busy(exc) and not conn.fired:
                raise own.refusal(self.using) from exc
            if watchdog().unwatch(conn):
                raise StoreTimeoutError(
                    f"The database {self.using!r} did not answer within {seconds:g}s; the call "
                    "was abandoned and its connection discarded."
                ) from exc
            raise StoreError(
                f"The database {self.using!r} failed a lock store call: {exc}{self._hint(exc)}"
            ) from exc
        finally:
            watchdog().unwatch(conn)

    def _hint(self, exc: BaseException) -> str:
        """The fix, for the failures that have one: the store's table is not there yet."""
        code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        text = str(exc)
        if code == UNDEFINED_TABLE or "no such table: django_locks_" in text:
            return (
                f" The lock store's table is missing from the database {self.using!r}: run "
                f"`manage.py migrate django_locks --database {self.using}`."
            )
        return ""

    # Getting a connection and giving it back.

    def _know_vendor(self) -> None:
        if not self.vendor:
            wrapper: Any = connections[self.using]
            self.vendor = wrapper.vendor
            self.errors = (DjangoDatabaseError, OSError, wrapper.Database.Error)

    def _checkout(self, state: _ProcessState, deadline: float, renewal: bool) -> StoreConnection:
        self._know_vendor()
        if self.vendor == "sqlite" and _in_memory(self.using):
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
            keep = not (broken or conn.close_requested or conn.closed) and state.pid == os.getpid()
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
        if _testcase_open(wrapper) and wrapper.connection is conn.raw:
            return self._checkout_borrowed(state, wrapper, deadline)
        state.borrowed = None
        return None

    def _connect(self, state: _ProcessState, deadline: float) -> StoreConnection:
        base = connections[self.using]
        options = {k: v for k, v in base.settings_dict["OPTIONS"].items() if k != "pool"}
        settings_dict = {**base.settings_dict, "OPTIONS": options}
        attempt = _ConnectAttempt(lambda: type(base)(settings_dict, self.using))
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
        conn = StoreConnection(attempt.raw, vendor=self.vendor, owned=True)
        conn.name = settings_dict["NAME"]
        conn.busy = True
        with state.lock:
            # Connections of threads that ended are closed here rather than left to the GC.
            dead = [c for c in state.conns if not c.busy and not c.thread.is_alive()]
            state.conns.difference_update(dead)
            state.conns.add(conn)
        for old in dead:
            old.close()
        return conn

    # Life cycle.

    def close(self) -> None:
        state = self.state
        if state.pid != os.getpid():
            return  # the parent's connections: never closed by a child
        with state.lock:
            to_close = [conn for conn in state.conns if not conn.busy]
            for conn in state.conns:
                conn.close_requested = True  # a busy one is closed by its thread, after its call
            state.conns.clear()
            state.idle.clear()
            state.shared = None
        for conn in to_close:
            conn.close()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's connections without closing them (closing
        would end the parent's sessions); they stay referenced so the GC never closes them."""
        runtime.keep_forever(self.state)
        self.state = _ProcessState()

    def _current_state(self) -> _ProcessState:
        if self.state.pid != os.getpid():
            self.forget_after_fork()
        return self.state


class _ConnectAttempt:
    def __init__(self, make_wrapper: Callable[[], Any]) -> None:
        # A private instance of the alias's backend, made on the connecting thread (Django's
        # wrappers refuse to be used from another thread than their creator's).
        self.make_wrapper = make_wrapper
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.abandoned = False
        self.raw: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        wrapper: Any = None
        try:
            wrapper = self.make_wrapper()
            wrapper.connect()
            if not wrapper.get_autocommit():
                wrapper.set_autocommit(True)
            raw = wrapper.connection
        except BaseException as exc:
            self.error = exc
            raw = None
            if wrapper is not None and wrapper.connection is not None:
                # Opened, then refused (pytest-django's blocker refuses inside connect()'s own
                # set_autocommit): left open, it would keep the test database from being dropped.
                with contextlib.suppress(Exception):
                    wrapper.connection.close()
        with self.lock:
            self.raw = raw
            self.done.set()
            late = self.abandoned
        if late and raw is not None:
            raw.close()

    def abandon(self) -> bool:
        """``True`` when the attempt was still running (it is now abandoned)."""
        with self.lock:
            if self.done.is_set():
                return False
            self.abandoned = True
            return True


def _in_memory(using: str) -> bool:
    wrapper: Any = connections[using]
    return bool(wrapper.is_in_memory_db())


class _OwnTransaction:
    """This thread's open transaction on the SQLite file a store call is about to write."""

    def __init__(self, wrapper: Any, *, testcase: bool, certain: bool) -> None:
        self.wrapper = wrapper
        self.testcase = testcase  # a TestCase's: the store writes through its connection
        self.certain = certain  # it holds the write lock for sure (IMMEDIATE or EXCLUSIVE)

    def refusal(self, using: str) -> StoreError:
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


def _testcase_open(wrapper: Any) -> bool:
    """Whether ``wrapper``'s outermost open atomic block is a TestCase's."""
    blocks = wrapper.atomic_blocks
    return bool(wrapper.in_atomic_block and blocks and getattr(blocks[0], "_from_testcase", False))


def _own_transaction(using: str) -> _OwnTransaction | None:
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
        if _testcase_open(wrapper):
            return _OwnTransaction(wrapper, testcase=True, certain=False)
        if wrapper.connection.in_transaction:
            mode = getattr(wrapper, "transaction_mode", None)
            return _OwnTransaction(
                wrapper, testcase=False, certain=mode in ("IMMEDIATE", "EXCLUSIVE")
            )
    return None


def _sqlite_file(name: object) -> str:
    return os.path.realpath(os.fspath(name)) if isinstance(name, str | os.PathLike) else ""


def _sqlite_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (SQLITE_BUSY), however wrapped."""
    for error in (exc, exc.__cause__):
        code = getattr(error, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == 5:  # SQLITE_BUSY and its extended codes
            return True
        if error is not None and "database is locked" in str(error):
            return True
    return False


def _run_sqlite(
    conn: StoreConnection,
    fn: Callable[[Any], T],
    deadline: float,
    write: bool,
    busy_wait: float | None = None,
) -> T:
    raw = conn.raw
    cursor = raw.cursor()
    try:
        if conn.owned:
            # Waiting for another process's write lock counts against the call's timeout; with
            # this thread's own transaction open on the file, only ``busy_wait``.
            left = deadline - time.monotonic()
            if busy_wait is None:
                ms = max(1, math.ceil(left * 1000))
            else:
                ms = max(0, math.ceil(min(left, busy_wait) * 1000))
            cursor.execute(f"PRAGMA busy_timeout = {ms}")
        if not write:
            return fn(cursor)
        # BEGIN IMMEDIATE takes the write lock up front; inside a transaction of Django's own
        # (the in-memory test database) a savepoint makes the statements one step instead.
        nested = raw.in_transaction
        cursor.execute("SAVEPOINT django_locks" if nested else "BEGIN IMMEDIATE")
        try:
            result = fn(cursor)
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


# Per process: the stores (to forget their connections in a forked child). The watchdog is the
# stores' shared one (stores/runtime.py).
_STORES: weakref.WeakSet[Pools] = weakref.WeakSet()


def register(pools: Pools) -> None:
    _STORES.add(pools)


def _after_fork_in_child() -> None:
    for pools in list(_STORES):
        pools.forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
