"""``ManualClock``: time that moves only when a test says so."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import threading
from collections.abc import Iterable

from django_locks.abort import AbortSignal
from django_locks.clock import Clock, Task, TimerHandle
from django_locks.durations import Duration, to_seconds
from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")


class ManualClock(Clock):
    """A clock that stands still until :meth:`advance` moves it.

    ``advance()`` fires every timer due on the way (renewals, retries, deadlines) in time order,
    each at its own instant, running the store calls and the notifications (``lock_lost``, signal
    callbacks) in the calling thread: when ``advance()`` returns, each has reached the store.
    A process whose clock does not move behaves like a paused process: with a server store, whose
    clock is real, its leases expire for real. ``sleep()`` (a waiting acquire) blocks until another
    thread advances the clock far enough, or the signal aborts.

    ``stores``: server stores whose leases travel in time with this clock: each time it moves, it
    calls their ``warp()`` (a testing capability of the database and Redis stores) with the time
    moved, before the timers due then fire, so an ``advance("31s")`` expires a 30 s lease on
    PostgreSQL or Redis with no sleeping. :meth:`attach` adds one later. An ``InMemoryStore``
    given this clock (``InMemoryStore(clock=clock)``) follows it already: do not attach it too.
    """

    def __init__(self, start: float = 0.0, *, stores: Iterable[LockStore] = ()) -> None:
        self._now = float(start)
        self._cond = threading.Condition(threading.RLock())
        self._advancing = threading.Lock()
        self._timers: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._stores: list[LockStore] = []
        self._warped_ms = math.floor(self._now * 1000)  # where the attached stores are, in ms
        for store in stores:
            self.attach(store)

    def attach(self, store: LockStore) -> None:
        """Make ``store``'s leases travel in time with this clock from now on (see the class)."""
        if not isinstance(store, LockStore):
            raise TypeError(f"`store` must be a LockStore, got {type(store).__name__} {store!r}")
        if type(store).warp is LockStore.warp:
            raise TypeError(
                f"`store` {store!r} cannot travel in time: it does not implement warp() "
                "(the database, Redis and in-memory stores do)"
            )
        with self._cond:
            if store not in self._stores:
                self._stores.append(store)

    def _warp_stores(self) -> None:
        """Bring the attached stores to this clock's time (from the thread moving it)."""
        with self._cond:
            wanted = math.floor(self._now * 1000)
            if not self._stores:
                self._warped_ms = wanted
                return
            delta = wanted - self._warped_ms
            self._warped_ms = wanted
            stores = list(self._stores)
        if delta > 0:
            for store in stores:
                store.warp(delta)

    def __repr__(self) -> str:
        return f"<ManualClock at {self._now:g}s, {len(self._timers)} timers>"

    def monotonic(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Task) -> TimerHandle:
        handle = TimerHandle(when, callback)
        with self._cond:
            heapq.heappush(self._timers, (when, next(self._seq), handle))
        return handle

    def spawn(self, task: Task) -> None:
        task()

    def notify(self, task: Task) -> None:
        task()

    def advance(self, duration: Duration) -> None:
        """Move time forward by ``duration``, firing everything due on the way, in order, each
        at its own instant."""
        self._run_until(self._now + to_seconds(duration, name="duration", allow_zero=True))

    def resume_after(self, duration: Duration) -> None:
        """Act out a process paused for ``duration``: time jumps at once, then everything that
        fell due during the pause fires, late, in order (as timers do when a process wakes up)."""
        target = self._now + to_seconds(duration, name="duration", allow_zero=True)
        with self._advancing, self._cond:
            self._now = target
        self._warp_stores()  # the store's time passed during the pause
        self._run_until(target)

    def _run_until(self, target: float) -> None:
        with self._advancing:
            while True:
                with self._cond:
                    while self._timers and self._timers[0][2].cancelled:
                        heapq.heappop(self._timers)
                    if not self._timers or self._timers[0][0] > target:
                        self._now = target
                        self._cond.notify_all()
                        break
                    when, _, handle = heapq.heappop(self._timers)
                    self._now = max(self._now, when)
                    self._cond.notify_all()
                self._warp_stores()
                try:
                    handle.callback()
                except Exception:
                    logger.exception("ManualClock timer callback %r failed", handle.callback)
            self._warp_stores()

    def sleep(self, seconds: float, signal: AbortSignal | None = None) -> None:
        wake_at = self._now + seconds
        with self._cond:
            while self._now < wake_at and not (signal is not None and signal.aborted):
                self._cond.wait(0.01)

    async def asleep(self, seconds: float, signal: AbortSignal | None = None) -> None:
        wake_at = self._now + seconds
        while self._now < wake_at and not (signal is not None and signal.aborted):
            await asyncio.sleep(0.005)
