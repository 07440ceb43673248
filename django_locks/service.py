"""``Locks``: acquire, lock, with_lock and their async twins; and ``locks``, the default service."""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from django.utils.functional import LazyObject, empty

from django_locks import durations
from django_locks.abort import AbortSignal
from django_locks.aio import ReleaseNotices, attempt
from django_locks.clock import Clock, system_clock
from django_locks.context import _current
from django_locks.durations import Duration
from django_locks.exceptions import LockNotAcquiredError, StoreTimeoutError
from django_locks.keys import validate_key
from django_locks.lock import Lock
from django_locks.notices import NOTICE_SLICE, wait_for_release
from django_locks.policy import POLICY
from django_locks.renewal import Keeper
from django_locks.stores.base import LockStore

if TYPE_CHECKING:
    import contextvars

logger = logging.getLogger("django_locks")

T = TypeVar("T")

MIN_TTL_MS = durations.MIN_TTL_MS
"""The shortest ttl a lock may have, in milliseconds (``django_locks.durations`` has the bounds)."""


class Locks:
    """Distributed locks on one store.

    ``ttl`` is the default ttl of every lock; ``clock`` (default: the system clock) times renewals
    and deadlines, ``django_locks.testing.ManualClock`` in tests. Thread-safe; one per store is
    enough for a process. ``django_locks.locks`` is the one configured from the ``LOCKS`` setting.
    """

    def __init__(self, store: LockStore, *, ttl: Duration = "30s", clock: Clock | None = None):
        if not isinstance(store, LockStore):
            raise TypeError(f"`store` must be a LockStore, got {type(store).__name__} {store!r}")
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"`clock` must be a django_locks Clock, got {clock!r}")
        self.store = store
        self.ttl_ms = _lock_ttl(ttl)
        self.clock = clock if clock is not None else system_clock
        # Whether to wait for the store's release notices (until it says it has none).
        self._notified = True
        self._notices: ReleaseNotices[Lock] = ReleaseNotices(store, NOTICE_SLICE)

    def __repr__(self) -> str:
        return f"<Locks store={self.store!r} ttl={self.ttl_ms}ms>"

    # Synchronous API.

    def acquire(
        self,
        key: str,
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
    ) -> Lock | None:
        """Take ``key``; return the ``Lock``, or ``None`` when it stayed taken.

        ``ttl``: the lease's ttl (default: the service's). ``wait``: how long to keep trying
        (0: try once), retrying with capped exponential backoff and jitter. ``signal``: an
        ``AbortSignal`` that stops the waiting (``None`` is returned). Raises ``ValueError`` /
        ``TypeError`` on bad arguments before any I/O, ``StoreError`` when the store fails.
        """
        ttl_ms, wait_s = self._check(key, ttl, wait, signal)
        return self._acquire(key, ttl_ms, wait_s, signal)

    def _acquire(
        self, key: str, ttl_ms: int, wait_s: float, signal: AbortSignal | None
    ) -> Lock | None:
        """:meth:`acquire` with its arguments checked already."""
        give_up = self.clock.monotonic() + wait_s
        attempt = 0
        while signal is None or not signal.aborted:
            lock = self._try(key, ttl_ms)
            if lock is not None:
                return lock
            remaining = give_up - self.clock.monotonic()
            if remaining <= 0:
                break
            self._pause(key, min(POLICY.backoff(attempt), remaining), signal)
            attempt += 1
        return None

    def lock(
        self,
        key: str,
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
    ) -> LockBlock:
        """A context manager holding ``key`` for its block, yielding the ``Lock``.

        Raises ``LockNotAcquiredError`` when the key stayed taken; releases on exit, also when the
        block raises. Inside, ``current_lock()`` is this lock. ``async with locks.alock(...)`` for
        coroutines.
        """
        return LockBlock(self, key, *self._check(key, ttl, wait, signal), signal)

    def with_lock(
        self,
        key: str,
        fn: Callable[[], T],
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
    ) -> T:
        """Run ``fn()`` holding ``key``; return its result (``LockNotAcquiredError`` if taken)."""
        if not callable(fn):
            raise TypeError(f"`fn` must be callable, got {fn!r}")
        with self.lock(key, ttl=ttl, wait=wait, signal=signal):
            return fn()

    # Asynchronous twins: store calls run in threads, waiting uses the event loop.

    async def aacquire(
        self,
        key: str,
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
    ) -> Lock | None:
        """:meth:`acquire` for coroutines: store calls run in threads, and a waiter is woken
        by the store's release notices as a thread is. Cancelled at any point, it releases
        what it got."""
        ttl_ms, wait_s = self._check(key, ttl, wait, signal)
        return await self._aacquire(key, ttl_ms, wait_s, signal)

    async def _aacquire(
        self, key: str, ttl_ms: int, wait_s: float, signal: AbortSignal | None
    ) -> Lock | None:
        """:meth:`aacquire` with its arguments checked already."""
        give_up = self.clock.monotonic() + wait_s
        attempt = 0
        tried = False  # the last pause made the next try already
        while signal is None or not signal.aborted:
            lock = None if tried else await self._atry(key, ttl_ms)
            if lock is not None:
                return lock
            remaining = give_up - self.clock.monotonic()
            if remaining <= 0:
                break
            pause = min(POLICY.backoff(attempt), remaining)
            tried, lock = await self._apause(key, ttl_ms, pause, signal)
            if lock is not None:
                return lock
            attempt += 1
        return None

    def alock(
        self,
        key: str,
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
    ) -> LockBlock:
        """:meth:`lock` for ``async with``."""
        return LockBlock(self, key, *self._check(key, ttl, wait, signal), signal)

    async def awith_lock(
        self,
        key: str,
        fn: Callable[[], Awaitable[T]],
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
    ) -> T:
        """Await ``fn()`` holding ``key``; return its result (``LockNotAcquiredError``: taken)."""
        if not callable(fn):
            raise TypeError(f"`fn` must be callable, got {fn!r}")
        async with self.alock(key, ttl=ttl, wait=wait, signal=signal):
            return await fn()

    # Internals.

    def _pause(self, key: str, seconds: float, signal: AbortSignal | None) -> None:
        """Wait before the next try: woken by the store's release notice where it offers one
        (real time only), else sleeping through the backoff; early when ``signal`` aborts."""
        if self._notified and self.clock is system_clock:
            until = time.monotonic() + seconds
            if wait_for_release(self.store, key, until, stop=signal) == "no notices":
                self._notified = False  # the next pauses sleep without asking the store
            return
        self.clock.sleep(seconds, signal)

    async def _apause(
        self, key: str, ttl_ms: int, seconds: float, signal: AbortSignal | None
    ) -> tuple[bool, Lock | None]:
        """:meth:`_pause` for coroutines, on the event loop. Woken by a release notice, it
        comes back with the next try made (``(True, lock or None)``; made by the thread that
        got the notice, at once); else ``(False, None)`` once ``seconds`` passed."""
        notices = self._notices
        if self._notified and notices.supported and self.clock is system_clock:
            return await notices.wait(
                key, seconds, signal, lambda: self._try(key, ttl_ms), self._discard
            )
        await self.clock.asleep(seconds, signal)
        return False, None

    def _discard(self, lock: Lock) -> None:
        """Release, off the event loop, a lock its cancelled acquirer will never see."""
        self.clock.spawn(lock.release)

    def _check(
        self, key: object, ttl: Duration | None, wait: Duration, signal: object
    ) -> tuple[int, float]:
        validate_key(key)
        ttl_ms = self.ttl_ms if ttl is None else _lock_ttl(ttl)
        # The common `wait=0` skips parsing; `False` (== 0) is refused like `True`.
        wait_s = 0.0 if type(wait) is int and wait == 0 else durations.wait_ms(wait) / 1000
        if signal is not None and not isinstance(signal, AbortSignal):
            raise TypeError(f"`signal` must be an AbortSignal or None, got {signal!r}")
        return ttl_ms, wait_s

    def _try(self, key: str, ttl_ms: int) -> Lock | None:
        """One acquire round trip with a fresh owner id."""
        owner = _new_owner()
        sent = self.clock.monotonic()
        # The call may take no longer than the lease it asks for would be valid.
        timeout = POLICY.acquire_timeout(ttl_ms)
        try:
            token = self.store.acquire(key, owner, ttl_ms, timeout=timeout)
        except StoreTimeoutError:
            # The store may have granted it before the timeout: acquire is idempotent for the same
            # owner, so one retry recovers the lease (same token) instead of stranding it.
            sent = self.clock.monotonic()
            token = self.store.acquire(key, owner, ttl_ms, timeout=timeout)
        if token is None:
            return None
        keeper = Keeper(
            store=self.store,
            clock=self.clock,
            sender=Locks,  # the one documented sender of every signal, subclass or not
            key=key,
            owner=owner,
            fencing_token=token,
            ttl_ms=ttl_ms,
            sent=sent,
        )
        return Lock(keeper)

    async def _atry(self, key: str, ttl_ms: int) -> Lock | None:
        """:meth:`_try` in a thread. When the awaiting task is cancelled mid-call, the lock the
        call gets is released (whichever side sees it last: the thread's answer, or the
        cancelled task)."""
        return await attempt(lambda: self._try(key, ttl_ms), self._discard)


class LockBlock:
    """What :meth:`Locks.lock` and :meth:`Locks.alock` return: holds the key for one block."""

    def __init__(
        self, locks: Locks, key: str, ttl_ms: int, wait_s: float, signal: AbortSignal | None
    ) -> None:
        # Checked by lock() / alock() already: entering validates nothing again.
        self._locks = locks
        self._args = (key, ttl_ms, wait_s, signal)
        self._key = key
        self._lock: Lock | None = None
        self._context_token: contextvars.Token[Lock | None] | None = None

    def _entered(self, lock: Lock | None) -> Lock:
        if lock is None:
            raise LockNotAcquiredError(self._key, self._args[2])
        self._lock = lock
        self._context_token = _current.set(lock)
        return lock

    def _leaving(self) -> Lock:
        assert self._lock is not None and self._context_token is not None
        _current.reset(self._context_token)
        return self._lock

    def __enter__(self) -> Lock:
        return self._entered(self._locks._acquire(*self._args))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The lock's own block ends the same way: released, a failure logged, not raised.
        self._leaving().__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> Lock:
        return self._entered(await self._locks._aacquire(*self._args))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Runs to its end whatever the cancellation (see Lock.arelease).
        await self._leaving().__aexit__(exc_type, exc, tb)


class _Owners:
    """Owner ids: unique across processes (a random prefix) and in one (a counter), without a
    system call per lock. A forked child draws a prefix of its own: it must never reuse the
    parent's ids, or it could "re-acquire" the parent's leases idempotently."""

    def __init__(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()

    def new(self) -> str:
        return f"{self.prefix}{next(self.counter):016x}"


_owners = _Owners()


def _new_owner() -> str:
    return _owners.new()


def renew_owners_after_fork() -> None:
    """After fork(), in the child (``django_locks.process.AFTER_FORK``)."""
    global _owners
    _owners = _Owners()


def _lock_ttl(ttl: Duration) -> int:
    return durations.ttl_ms(ttl)


class DefaultLocks(LazyObject):  # type: ignore[type-arg]
    """The ``Locks`` configured from the ``LOCKS`` setting, built on first use and rebuilt when
    the setting changes (``override_settings``)."""

    _wrapped: object

    def _setup(self) -> None:
        self._wrapped = _from_settings()

    def _reset(self) -> None:
        wrapped = self._wrapped
        self._wrapped = empty
        if isinstance(wrapped, Locks):
            wrapped.store.close()


def _from_settings() -> Locks:
    """The service ``LOCKS`` describes: conf reads the setting and builds the store, the
    service puts them together (conf never builds nor resets a service)."""
    from django_locks import conf

    config = conf.get()
    store = conf.build_store(config)
    clock = config.clock
    # A ManualClock in LOCKS["CLOCK"] moves a server store's leases with it (warp(), SPEC
    # section 7); a store that takes the clock (the in-memory one) was given it instead.
    attach = getattr(clock, "attach", None)
    if (
        attach is not None
        and not conf.takes_clock(config.backend)
        and type(store).warp is not LockStore.warp
    ):
        attach(store)
    # The ttl in the milliseconds it was validated to, not through seconds and back.
    return Locks(store, ttl=f"{config.ttl_ms}ms", clock=clock)


_default = DefaultLocks()
locks: Locks = _default  # type: ignore[assignment]


def forget_default() -> None:
    """Close and forget the default service (``LOCKS`` changed): the next use builds it anew."""
    _default._reset()
