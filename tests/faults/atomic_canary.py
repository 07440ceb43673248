"""The atomic canary of a fault worker: the canary's unfenced read-modify-write, on a row of its
own (``a:<key>``) in the lock store's own database, inside ``lock.atomic()``.

The block spans the critical section as the canary's read and write do: ``open`` enters
``lock.atomic()`` and reads the row, ``close`` writes read + 1 and leaves the block (its
conditional COMMIT). Under ``delayed_write`` the round's block writes nothing (rolled back) and
``hand_off`` runs the write in a thread of its own: the thread enters ``lock.atomic()`` while the
lock is held (the block's first statement in time), then its write and its COMMIT reach the
database 1.5 to 3 ttl later, after the release.

Each block that was entered ends with one ``write`` event of kind ``atomic`` whose ``result``
is ``committed`` (accepted), ``refused`` (``LockLostError`` from ``lock.atomic()``: rolled
back, nothing written), ``failed`` (another error: the server ended the session, say) or
``rolled_back`` (no write: the round handed it off); a block refused on entry is one
``atomic_refused_entry`` event (``ValueError``: the lock was no longer held).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_locks.exceptions import LockLostError

ENTRY_WAIT = 5.0
"""Seconds a delayed round waits for its thread to have entered its block (then it releases)."""


class HandedOff(Exception):
    """Leaves the round's own block with a rollback: the write went to the delayed thread."""


class AtomicCanary:
    def __init__(
        self, record: Callable[..., None], rows: Callable[[str, str], Any], using: str
    ) -> None:
        self.record = record
        self.rows = rows
        self.using = using  # the DatabaseStore's alias
        self.block: Any = None
        self.read = 0

    def _row(self, key: str) -> Any:
        return self.rows("a", key).using(self.using)

    def open(self, lock: Any, key: str) -> bool:
        """Enter ``lock.atomic()`` and read the row; False when the block was refused."""
        if self.block is not None:  # a round that ended by an error left it open
            self._leave(self.block, lock, key, None, time.monotonic(), HandedOff())
            self.block = None
        block = self._enter(lock, key)
        if block is None:
            return False
        try:
            self.read = self._row(key).values_list("count", flat=True).get()
        except Exception as exc:
            self._leave(block, lock, key, None, time.monotonic(), exc)
            return False
        self.block = block
        return True

    def _enter(self, lock: Any, key: str) -> Any:
        try:
            # Connected first: on SQLite lock.atomic() reads the connection's transaction_mode,
            # which Django sets only when it connects (a thread's first block was refused).
            connections[self.using].ensure_connection()
            block = lock.atomic()
            block.__enter__()
        except Exception as exc:
            self.record(
                "atomic_refused_entry", key=key, token=lock.fencing_token, error=repr(exc)[:200]
            )
            return None
        return block

    def close(self, lock: Any, key: str) -> None:
        """Write read + 1 and leave the block (the conditional COMMIT)."""
        block, self.block = self.block, None
        if block is not None:
            self._write(block, lock, key, self.read + 1)

    def hand_off(self, lock: Any, key: str, delay: float) -> None:
        """Roll the round's block back and write read + 1 from a thread whose block is entered
        now and whose write and COMMIT come ``delay`` seconds later."""
        block, self.block = self.block, None
        if block is None:
            return
        self._leave(block, lock, key, None, time.monotonic(), HandedOff())
        value = self.read + 1
        entered = threading.Event()

        def run() -> None:
            try:
                late = self._enter(lock, key)
                entered.set()
                if late is not None:
                    time.sleep(delay)
                    self._write(late, lock, key, value, delayed=delay)
            finally:
                entered.set()
                connections.close_all()

        threading.Thread(target=run, name="delayed-atomic").start()
        entered.wait(ENTRY_WAIT)

    def _write(self, block: Any, lock: Any, key: str, value: int, **extra: Any) -> None:
        start = time.monotonic()
        try:
            self._row(key).update(count=value)
        except Exception as exc:
            self._leave(block, lock, key, value, start, exc, **extra)
            return
        self._leave(block, lock, key, value, start, None, **extra)

    def _leave(
        self,
        block: Any,
        lock: Any,
        key: str,
        value: int | None,
        start: float,
        error: BaseException | None,
        **extra: Any,
    ) -> None:
        """Leave ``block`` (with ``error``: rolled back) and record how it ended."""
        result = "committed"
        failure: BaseException | None = error
        try:
            if error is None:
                block.__exit__(None, None, None)
            else:
                block.__exit__(type(error), error, error.__traceback__)
        except Exception as exc:
            failure = error or exc
        if isinstance(failure, HandedOff):
            result = "rolled_back"
        elif isinstance(failure, LockLostError):
            result = "refused"
        elif failure is not None:
            result = "failed"
            connections[self.using].close()
        self.record(
            "write",
            kind="atomic",
            key=key,
            token=lock.fencing_token,
            start=start,
            end=time.monotonic(),
            accepted=result == "committed",
            result=result,
            value=value,
            **({"error": repr(failure)[:200]} if result == "failed" else {}),
            **extra,
        )
