"""Clocks: where time comes from, and where timers, background store calls and notices run.

``SystemClock`` (the default) runs them on the process's one background renewal mechanism: a
timer thread that never does I/O (so a hanging store call cannot delay a deadline), a small pool
for store calls, and a notice thread for signals and callbacks (so a slow receiver cannot delay a
renewal). All three start lazily and are rebuilt in a child after ``fork()``.
``django_locks.testing.ManualClock`` runs everything in the thread that moves its time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django_locks import process  # noqa: F401  (registers the at-fork hook: see process.py)
from django_locks.abort import AbortSignal

logger = logging.getLogger("django_locks")

Task = Callable[[], object]

MAX_WAIT = 3600.0
"""The longest one wait of a background thread, in seconds: far below ``threading.TIMEOUT_MAX``,
so no deadline, however far, makes a wait overflow; the thread wakes and waits again."""
ERROR_PAUSE = 0.1
"""Seconds a background thread pauses after an unexpected error, so one that repeats cannot spin."""


class TimerHandle:
    """A scheduled call; :meth:`cancel` stops it if it has not run yet."""

    __slots__ = ("callback", "cancelled", "on_cancel", "when")

    def __init__(self, when: float, callback: Task, on_cancel: Task | None = None) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False
        self.on_cancel = on_cancel

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        # A cancelled timer may wait in the heap until its time; it must not keep what its
        # callback refers to (a released lock's whole renewal state) alive until then.
        self.callback = _cancelled
        if self.on_cancel is not None:
            self.on_cancel()


def _cancelled() -> None:
    """The callback of a cancelled timer (never called)."""


class Clock:
    """A monotonic time source in seconds, and the executor of the work timed by it."""

    def monotonic(self) -> float:
        raise NotImplementedError

    def call_at(self, when: float, callback: Task) -> TimerHandle:
        """Run ``callback()`` (quick, no I/O) once ``monotonic()`` reaches ``when``."""
        raise NotImplementedError

    def spawn(self, task: Task) -> None:
        """Run ``task()`` (a store call) in the background."""
        raise NotImplementedError

    def notify(self, task: Task) -> None:
        """Run ``task()`` (sending a signal, running callbacks) off the renewal path."""
        raise NotImplementedError

    def sleep(self, seconds: float, signal: AbortSignal | None = None) -> None:
        """Wait ``seconds`` of this clock's time, returning early when ``signal`` aborts."""
        raise NotImplementedError

    async def asleep(self, seconds: float, signal: AbortSignal | None = None) -> None:
        """:meth:`sleep` for coroutines."""
        raise NotImplementedError


class _TimerThread:
    """A heap of timers served by one daemon thread.

    Waking the thread costs the caller a thread switch, so a new timer wakes it only when it
    falls due before the time the thread sleeps until. Cancelled timers (every released lock
    leaves one) stay in the heap: the thread drops those falling due within ``SWEEP`` seconds
    each time it wakes, and sleeps until the next timer, cancelled or not. Dropping every
    cancelled one at once would leave the heap empty after each released lock, and the next
    lock's timer would wake the thread again: one switch per lock. When cancelled timers make
    up most of a large heap, ``call_at`` rebuilds it without them.
    """

    SWEEP = 1.0
    COMPACT_AT = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = math.inf  # when the thread wakes by itself
        self._cancelled = 0  # cancelled timers still in the heap (approximately)

    def call_at(self, when: float, callback: Task) -> TimerHandle:
        if type(when) is not float:
            when = float(when)  # here, in the caller: a bad value never enters the heap
        if when != when:
            when = math.inf  # NaN would break the heap's order: it never falls due
        handle = TimerHandle(when, callback, self._count_cancelled)
        with self._lock:  # the condition's lock (its own `with` is a Python-level call)
            if self._cancelled > self.COMPACT_AT and self._cancelled * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0
            heapq.heappush(self._heap, (when, next(self._seq), handle))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="django_locks-timer", daemon=True
                )
                self._thread.start()
            elif when < self._wake_at:
                self._wake_at = when
                self._cond.notify()
        return handle

    def _count_cancelled(self) -> None:
        self._cancelled += 1  # a heuristic: a lost update under a race only delays a rebuild

    def _run(self) -> None:
        # Nothing ends this loop: every lock of the process depends on it (SPEC section 10).
        while True:
            try:
                handle = self._next()
                if handle is None:
                    continue
            except BaseException:
                logger.exception("django_locks timer thread: unexpected error (it goes on)")
                time.sleep(ERROR_PAUSE)
                continue
            try:
                handle.callback()
            except BaseException:
                logger.exception("django_locks timer callback %r failed", handle.callback)

    def _next(self) -> TimerHandle | None:
        """Wait for the next timer falling due and take it out (``None``: a cancelled one)."""
        with self._cond:
            while True:
                now = time.monotonic()
                heap = self._heap
                while heap and heap[0][2].cancelled and heap[0][0] <= now + self.SWEEP:
                    heapq.heappop(heap)
                    self._cancelled -= 1
                if heap and heap[0][0] <= now:
                    break
                self._wake_at = heap[0][0] if heap else math.inf
                # Capped: a timer days away (or never) is waited for an hour at a time.
                self._cond.wait(min(self._wake_at - now, MAX_WAIT))
            _, _, handle = heapq.heappop(heap)
            self._wake_at = -math.inf  # awake: nobody needs to wake it
            if handle.cancelled:
                self._cancelled -= 1
                return None
            handle.on_cancel = None  # out of the heap: its cancel no longer counts
            return handle


class SystemClock(Clock):
    """The real clock: ``time.monotonic()``, and the process-wide background threads."""

    _POOL_SIZE = 4

    # time.monotonic itself: a builtin is not bound, `clock.monotonic()` calls it directly.
    monotonic = staticmethod(time.monotonic)

    def call_at(self, when: float, callback: Task) -> TimerHandle:
        return _background().timers.call_at(when, callback)

    def spawn(self, task: Task) -> None:
        _background().pool.submit(_logged, task)

    def notify(self, task: Task) -> None:
        _background().notices.put(task)

    def sleep(self, seconds: float, signal: AbortSignal | None = None) -> None:
        if signal is None:
            time.sleep(max(seconds, 0))
        else:
            signal.wait(max(seconds, 0))

    async def asleep(self, seconds: float, signal: AbortSignal | None = None) -> None:
        if signal is None:
            await asyncio.sleep(max(seconds, 0))
        else:
            await signal.wait_async(max(seconds, 0))

    def __repr__(self) -> str:
        return "<SystemClock>"


class _Background:
    """The one background renewal mechanism of this process (see the module docstring)."""

    def __init__(self) -> None:
        _warn_if_threads_cannot_run()
        self.timers = _TimerThread()
        self.pool = ThreadPoolExecutor(
            max_workers=SystemClock._POOL_SIZE, thread_name_prefix="django_locks-renewer"
        )
        self.notices: queue.SimpleQueue[Task] = queue.SimpleQueue()
        threading.Thread(target=self._notice_loop, name="django_locks-notices", daemon=True).start()

    def _notice_loop(self) -> None:
        while True:
            try:
                _logged(self.notices.get())
            except BaseException:
                logger.exception("django_locks notice thread: unexpected error (it goes on)")
                time.sleep(ERROR_PAUSE)


_background_lock = threading.Lock()
_background_instance: _Background | None = None


def _background() -> _Background:
    global _background_instance
    if _background_instance is None:
        with _background_lock:
            if _background_instance is None:
                _background_instance = _Background()
    return _background_instance


def forget_background_in_child() -> None:
    """After fork(), in the child (``django_locks.process.AFTER_FORK``)."""
    # The parent's threads do not exist in a child: start fresh ones on first use. The old pool is
    # dropped, not shut down (its threads are gone; shutting it down would wait for nothing).
    global _background_instance, _background_lock
    _background_instance = None
    _background_lock = threading.Lock()


def _warn_if_threads_cannot_run() -> None:
    """uWSGI runs no Python thread but the request's unless told to: then nothing renews locks
    (they lapse at their ttl, and their deadlines never fire). Say so loudly, once."""
    uwsgi = sys.modules.get("uwsgi")  # uWSGI's embedded module, present in its workers only
    if uwsgi is None:
        return
    options = getattr(uwsgi, "opt", {})
    if not (options.get("enable-threads") or options.get("threads")):
        logger.error(
            "uWSGI runs without --enable-threads: django_locks cannot renew locks in the "
            "background, so every lock lapses at its ttl while still in use. Start uWSGI with "
            "--enable-threads (or --threads N)."
        )


def _logged(task: Task) -> None:
    try:
        task()
    except BaseException:  # even SystemExit: it would end a background thread
        logger.exception("django_locks background task %r failed", task)


system_clock = SystemClock()
