"""Release notices of the database store on PostgreSQL: ``NOTIFY`` on release, ``LISTEN`` here.

Releases send ``pg_notify(CHANNEL, key)`` in their own statement (delivered at commit, also
through PgBouncer). Waiting needs a session that ``LISTEN``s: one connection per store and
process, opened on first use, read by a thread of its own that wakes the waiters of each key.
Behind PgBouncer in transaction mode a session's ``LISTEN`` does not hold: point the store's
``listen_using`` option at an alias that connects to PostgreSQL directly, or set it to ``False``
(waiters then sleep through their backoff).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from typing import Any

from django.db import connections

from django_locks.exceptions import StoreError

logger = logging.getLogger("django_locks")

CHANNEL = "django_locks_released"
RECONNECT_DELAY = 1.0
"""Seconds between attempts to reopen a listening connection that broke."""


class Listener:
    """One ``LISTEN`` session of one store in this process, and the waiters it wakes."""

    def __init__(self, using: str, connect_timeout: float) -> None:
        self.using = using
        self.connect_timeout = connect_timeout
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._releases: dict[str, int] = {}
        self._listening = False
        self._error: BaseException | None = None
        self._closed = False
        self._raw: Any = None
        self._thread: threading.Thread | None = None

    def wait(self, key: str, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a release notice of ``key``."""
        deadline = time.monotonic() + max(timeout, 0)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="django_locks-listener", daemon=True
                )
                self._thread.start()
            seen = self._releases.get(key, 0)
            while not self._listening and self._error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # Still connecting (a first wait is often shorter than a connect): no
                    # notice yet, which is no failure; the caller tries again at its pace.
                    return False
                self._cond.wait(remaining)
            if not self._listening and self._error is not None:
                raise StoreError(
                    f"Listening for releases on the database {self.using!r} failed: {self._error}"
                ) from self._error
            return self._cond.wait_for(
                lambda: self._releases.get(key, 0) != seen,
                timeout=max(deadline - time.monotonic(), 0),
            )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            raw, self._raw = self._raw, None
        if raw is not None and self.pid == os.getpid():
            with contextlib.suppress(Exception):
                raw.close()

    def _run(self) -> None:
        while not self._closed:
            try:
                raw = self._connect()
                with self._cond:
                    if self._closed:
                        raw.close()
                        return
                    self._raw = raw
                    self._listening = True
                    self._error = None
                    self._cond.notify_all()
                self._read(raw)
            except Exception as exc:
                with self._cond:
                    self._listening = False
                    self._error = exc
                    self._cond.notify_all()
                if not self._closed:
                    logger.debug("Listening for releases on %r failed: %s", self.using, exc)
                    time.sleep(RECONNECT_DELAY)

    def _connect(self) -> Any:
        base = connections[self.using]
        options = {k: v for k, v in base.settings_dict["OPTIONS"].items() if k != "pool"}
        wrapper: Any = type(base)({**base.settings_dict, "OPTIONS": options}, self.using)
        wrapper.connect()
        if not wrapper.get_autocommit():
            wrapper.set_autocommit(True)
        raw = wrapper.connection
        with raw.cursor() as cursor:
            cursor.execute(f"LISTEN {CHANNEL}")
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
        if keys:
            with self._cond:
                for key in keys:
                    self._releases[key] = self._releases.get(key, 0) + 1
                self._cond.notify_all()
