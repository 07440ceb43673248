"""Release notices of the database store on PostgreSQL: ``NOTIFY`` on release, ``LISTEN`` here.

Releases send ``pg_notify(CHANNEL, key)`` in their own statement (delivered at commit, also
through PgBouncer). Waiting needs a session that ``LISTEN``s: one connection per store and
process, opened on first use, read by a thread of its own that wakes the waiters of each key.
Behind PgBouncer in transaction mode a session's ``LISTEN`` does not hold: point the store's
``listen_using`` option at an alias that connects to PostgreSQL directly, or set it to ``False``
(waiters then sleep through their backoff). When the session dies (``pg_terminate_backend``,
``idle_session_timeout``, a proxy, a restart), waiters sleep through their backoff too, and the
thread reconnects every second until it is back.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import threading
import time
from typing import Any

from django_locks import process
from django_locks.clock import MAX_WAIT
from django_locks.stores.database.connections import PrivateBackend
from django_locks.stores.database.postgresql_sql import CHANNEL, LISTEN

__all__ = ["CHANNEL", "Listener"]

logger = logging.getLogger("django_locks")

RECONNECT_DELAY = 1.0
"""Seconds between attempts to reopen a listening connection that broke."""


class _Waiters:
    """The threads of this process waiting for releases of one key."""

    def __init__(self, lock: threading.Lock) -> None:
        self.cond = threading.Condition(lock)
        self.waiting = 0
        self.woken = 0  # notices handed to a waiter that has not taken its own yet


class Listener:
    """One ``LISTEN`` session of one store in this process, and the waiters it wakes.

    A release wakes ONE waiter of its key in each process (the one most likely to get the key
    next; waking them all would make each try a committed write, and all but one fail). A woken
    waiter that then loses the race, or gives up, simply waits again or tries at its own pace:
    every waiter also retries at the end of its backoff."""

    def __init__(self, using: str, connect_timeout: float) -> None:
        self.using = using
        self.connect_timeout = connect_timeout
        self.pid = process.pid()
        lock = threading.Lock()
        self._lock = lock
        self._cond = threading.Condition(lock)  # the session's state: listening, failed
        self._keys: dict[str, _Waiters] = {}
        self._listening = False
        self._error: BaseException | None = None
        self._closed = False
        self._raw: Any = None
        self._thread: threading.Thread | None = None

    def wait(self, key: str, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a release notice of ``key``.

        ``False`` at the timeout, also while the session is connecting or reconnecting (killed by
        ``pg_terminate_backend``, ``idle_session_timeout``, a proxy, a restart): the waiter then
        simply sleeps through its backoff and retries its acquire, whose own call says whether
        the store answers. Never raises ``StoreError``.
        """
        # One wait of at most MAX_WAIT (a longer one returns False then: callers wait again).
        deadline = time.monotonic() + min(max(timeout, 0), MAX_WAIT)
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                # Started on first use; started again should it ever have ended (it should not).
                self._thread = threading.Thread(
                    target=self._run, name="django_locks-listener", daemon=True
                )
                self._thread.start()
            while not self._listening:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # No session (yet, or for now): no notice, which is no failure.
                    return False
                self._cond.wait(remaining)  # notified when the session is (back) up
            waiters = self._keys.get(key)
            if waiters is None:
                waiters = self._keys[key] = _Waiters(self._lock)
            waiters.waiting += 1
            try:
                woken = waiters.cond.wait_for(
                    lambda: waiters.woken > 0, timeout=max(deadline - time.monotonic(), 0)
                )
                if woken:
                    waiters.woken -= 1
                return woken
            finally:
                waiters.waiting -= 1
                if not waiters.waiting:
                    del self._keys[key]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            raw, self._raw = self._raw, None
        if raw is not None and self.pid == process.pid():
            with contextlib.suppress(Exception):
                raw.close()

    def _run(self) -> None:
        """Listen, and reconnect whenever the session breaks, until closed: nothing ends it."""
        while not self._closed:
            try:
                self._listen_once()
            except Exception as exc:  # this thread outlives whatever one session does
                with contextlib.suppress(Exception):
                    self._failed(exc)
            if not self._closed:
                time.sleep(RECONNECT_DELAY)

    def _listen_once(self) -> None:
        """Open a session, ``LISTEN``, and read notices until it breaks (raises) or is closed."""
        raw = self._connect()
        with self._cond:
            if self._closed:
                raw.close()
                return
            self._raw = raw
            self._listening = True
            was_down, self._error = self._error, None
            self._cond.notify_all()
        if was_down is not None:
            logger.info(
                "Release notices on %r are back: waiters are woken by them again", self.using
            )
        self._read(raw)

    def _failed(self, exc: BaseException) -> None:
        with self._cond:
            first = self._error is None  # the first failure of this outage
            self._listening = False
            self._error = exc
            raw, self._raw = self._raw, None
            self._cond.notify_all()
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.close()
        if self._closed:
            return
        log = logger.warning if first else logger.debug
        log(
            "Listening for release notices on %r failed (%s): waiters sleep through their "
            "backoff until the session is back (reconnecting every %.0f s)",
            self.using,
            exc,
            RECONNECT_DELAY,
        )

    def _connect(self) -> Any:
        # A reconnect to an unreachable server gives up (and tries again) rather than hang.
        backend = PrivateBackend(
            self.using, connect_timeout=max(2, math.ceil(self.connect_timeout))
        )
        raw = backend.connect()
        try:
            with raw.cursor() as cursor:
                cursor.execute(LISTEN)
        except BaseException:
            with contextlib.suppress(Exception):
                raw.close()
            raise
        return raw

    def _read(self, raw: Any) -> None:
        psycopg2 = type(raw).__module__.startswith("psycopg2")
        while not self._closed:
            if psycopg2:
                readable, _, _ = select.select([raw.fileno()], [], [], 1.0)
                if readable:
                    raw.poll()
                    self._released([notice.payload for notice in raw.notifies])
                    raw.notifies.clear()
            else:
                # Yields each notice as it arrives; returns after a second without one, so
                # that close() is noticed.
                for notice in raw.notifies(timeout=1.0):
                    self._released([notice.payload])

    def _released(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                waiters = self._keys.get(key)
                if waiters is not None and waiters.woken < waiters.waiting:
                    waiters.woken += 1
                    waiters.cond.notify()
