"""``AbortSignal``: a holder's cancellation token (not a Django signal)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable

from django_locks.exceptions import AbortedError

logger = logging.getLogger("django_locks")

Callback = Callable[["AbortSignal"], object]

_MAX_WAIT = 3600.0
"""Seconds of one wait at most (``threading.TIMEOUT_MAX`` is far beyond, but finite)."""


class AbortSignal:
    """Set once, when a lock is lost or released, or when its maker calls :meth:`abort`.

    Work running under a lock polls :attr:`aborted`, blocks on :meth:`wait` /
    :meth:`wait_async`, or registers a callback. Thread-safe; aborting twice keeps the first
    reason. A caller may make one to stop a waiting ``acquire()``.
    """

    def __init__(self) -> None:
        # Made by the first wait(): most locks are released without anyone blocking on theirs.
        self._event: threading.Event | None = None
        self._mutex = threading.Lock()
        self._callbacks: list[Callback] = []
        self._reason: BaseException | None = None

    def __repr__(self) -> str:
        state = f"aborted: {self._reason!r}" if self.aborted else "active"
        return f"<AbortSignal {state}>"

    @property
    def aborted(self) -> bool:
        """Whether the signal was aborted."""
        return self._reason is not None

    @property
    def reason(self) -> BaseException | None:
        """Why it was aborted (a ``LockLostError``, say), or ``None`` while active."""
        return self._reason

    def raise_if_aborted(self) -> None:
        """Raise :attr:`reason` if the signal was aborted; do nothing otherwise."""
        if self._reason is not None:
            raise self._reason

    def wait(self, timeout: float | None = None) -> bool:
        """Block until aborted or ``timeout`` seconds passed; return :attr:`aborted`."""
        with self._mutex:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if timeout is None or timeout == math.inf:
            return event.wait()
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout):
            raise TypeError(f"`timeout` must be a number of seconds or None, got {timeout!r}")
        try:
            seconds = max(float(timeout), 0.0)
        except OverflowError:  # an int too large for a float: forever, as far as anyone waits
            return event.wait()
        # Waited in slices: no timeout, however large, reaches the lock as an overflow.
        give_up = time.monotonic() + seconds
        while not event.wait(max(min(give_up - time.monotonic(), _MAX_WAIT), 0.0)):
            if time.monotonic() >= give_up:
                return False
        return True

    async def wait_async(self, timeout: float | None = None) -> bool:
        """Like :meth:`wait` without blocking the event loop; return :attr:`aborted`."""
        if self.aborted:
            return True
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def resolve() -> None:
            if not woken.done():
                woken.set_result(None)

        def wake(_: AbortSignal) -> None:
            loop.call_soon_threadsafe(resolve)

        self.add_callback(wake)
        try:
            await asyncio.wait_for(woken, timeout)
        except TimeoutError:
            pass
        finally:
            self.remove_callback(wake)
        return self.aborted

    def add_callback(self, fn: Callback) -> None:
        """Call ``fn(signal)`` once when aborted (at once if it already is).

        Callbacks of a lock's signal run off the renewal thread; a failing callback is logged.
        """
        with self._mutex:
            if self._reason is None:
                self._callbacks.append(fn)
                return
        _run_callback(fn, self)

    def abort(self, reason: BaseException | None = None) -> None:
        """Abort with ``reason`` (default: ``AbortedError``), waking waiters and callbacks."""
        callbacks = self._set(reason)
        for fn in callbacks:
            _run_callback(fn, self)

    def _set(self, reason: BaseException | None) -> list[Callback]:
        """Mark aborted at once; return the callbacks still to run (empty if already aborted)."""
        with self._mutex:
            if self._reason is not None:
                return []
            self._reason = reason if reason is not None else AbortedError("aborted")
            if self._event is not None:
                self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        return callbacks

    def remove_callback(self, fn: Callback) -> None:
        """Forget a callback added with :meth:`add_callback` (if it is there)."""
        with self._mutex, contextlib.suppress(ValueError):
            self._callbacks.remove(fn)

    def _after_fork(self) -> None:
        """In a forked child: a new mutex (another thread of the parent may have held this one
        at fork() time). Called by :class:`AbortController` only."""
        self._mutex = threading.Lock()


class AbortController:
    """The holder's side of an :class:`AbortSignal` (package-internal, as the web's
    ``AbortController`` is to its signal): it makes the signal, settles it without running the
    callbacks (the holder runs them off its critical path) and makes it usable after ``fork()``.

    Only this module touches a signal's private state: the keeper of a lock holds a controller
    and goes through it, so no other class reads or writes an ``AbortSignal``'s fields.
    """

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def settle(self, reason: BaseException) -> list[Callback]:
        """Abort the signal at once with ``reason``; return the callbacks still to run (empty
        if it was aborted already), for the caller to run when it is ready."""
        return self.signal._set(reason)

    def reset_after_fork(self) -> None:
        """Make the signal usable in a forked child (see ``AbortSignal._after_fork``)."""
        self.signal._after_fork()


def _run_callback(fn: Callback, signal: AbortSignal) -> None:
    try:
        fn(signal)
    except Exception:
        logger.exception("An AbortSignal callback %r failed", fn)
