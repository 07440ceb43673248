"""``Locks``: acquire, lock, with_lock and their async twins; and ``locks``, the default service."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from django_locks import durations
from django_locks.abort import AbortSignal
from django_locks.aio import ReleaseNotices, attempt
from django_locks.attempts import told_acquired, told_not_acquired, try_once
from django_locks.block import LockBlock as LockBlock  # where the API reference shows it
from django_locks.clock import Clock, system_clock
from django_locks.durations import Duration
from django_locks.events import Use, check_label, label_of
from django_locks.exceptions import StoreError
from django_locks.holders import Holder
from django_locks.keys import MAX_KEY_LENGTH, check_permits, permit_suffix, validate_key
from django_locks.lock import Lock
from django_locks.notices import NOTICE_SLICE, wait_for_release
from django_locks.on_commit import Release, check_release, commit_alias, refuse_async
from django_locks.policy import POLICY
from django_locks.service_default import DefaultLocks
from django_locks.service_leases import LeaseQueries
from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")

T = TypeVar("T")

MIN_TTL_MS = durations.MIN_TTL_MS
"""The shortest ttl a lock may have, in milliseconds (``django_locks.durations`` has the bounds)."""


class Locks(LeaseQueries):
    """Distributed locks on one store.

    ``ttl`` is the default ttl of every lock; ``clock`` (default: the system clock) times renewals
    and deadlines, ``django_locks.testing.ManualClock`` in tests. ``key_prefix`` is prepended to
    every key before the store sees it (and counts towards its 500 characters); everything
    people see names keys without it. ``max_hold``: the default ``max_hold`` of locks and runs
    (never of owner leases or elections). Thread-safe; one per store is enough for a process.
    ``django_locks.locks`` is the one configured from the ``LOCKS`` setting.
    """

    def __init__(
        self,
        store: LockStore,
        *,
        ttl: Duration = "30s",
        clock: Clock | None = None,
        key_prefix: str = "",
        max_hold: Duration | None = None,
    ):
        if not isinstance(store, LockStore):
            raise TypeError(f"`store` must be a LockStore, got {type(store).__name__} {store!r}")
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"`clock` must be a django_locks Clock, got {clock!r}")
        if key_prefix != "":
            validate_key(key_prefix, name="key_prefix")
        self.store = store
        self.key_prefix = key_prefix
        self.max_hold_ms = durations.max_hold_ms(max_hold)
        self.ttl_ms = durations.ttl_ms(ttl)
        self.clock = clock if clock is not None else system_clock
        # Whether to wait for the store's release notices (until it says it has none).
        self._notified = True
        self._notices: ReleaseNotices[Lock | Holder] = ReleaseNotices(store, NOTICE_SLICE)

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
        permits: int = 1,
        max_hold: Duration | None = None,
        label: str | None = None,
    ) -> Lock | None:
        """Take ``key``; return the ``Lock``, or ``None`` when it stayed taken.

        ``ttl``: the lease's ttl (default: the service's). ``wait``: how long to keep trying
        (0: try once), retrying with capped exponential backoff and jitter. ``signal``: an
        ``AbortSignal`` that stops the waiting (``None`` is returned). ``label``: the metrics
        label (default: the key up to its first ``:`` or ``{``). ``permits``: up to this many
        holders of ``key`` at once (1 to 1000; above 1 the lock is one of its permits,
        :attr:`Lock.permit`; every caller of a key gives the same value, else
        ``PermitsMismatchError``). ``max_hold``: renewals stop this long after the acquire
        (the signal then aborts with ``LockLostError(detected_by="max_hold")`` and the lease
        lapses at its ttl); ``None`` (the default): the service's, ``LOCKS["MAX_HOLD"]``.
        Raises ``ValueError`` / ``TypeError`` on bad arguments before any I/O, ``StoreError``
        when the store fails.
        """
        ttl_ms, wait_s, permits, hold_ms = self._check(key, ttl, wait, signal, permits, max_hold)
        found = self._acquire(
            key, ttl_ms, wait_s, signal, check_label(label), permits=permits, max_hold_ms=hold_ms
        )
        return _lock_only(found)

    def _acquire(
        self,
        key: str,
        ttl_ms: int,
        wait_s: float,
        signal: AbortSignal | None,
        label: str | None = None,
        use: Use = "acquire",
        *,
        permits: int = 1,
        max_hold_ms: int | None = None,
    ) -> Lock | Holder | None:
        """:meth:`acquire` with its arguments checked already: the ``Lock``, else the holder
        the last try found (``None`` when the store cannot say, or no try was made). The
        event stream is told how it went (``label``: checked, or None for the key's own).
        ``max_hold_ms``: None for none (owner leases and elections take no default)."""
        began = self.clock.monotonic()
        give_up = began + wait_s
        attempt = 0
        found: Lock | Holder | None = None
        label = label_of(key) if label is None else label
        try:
            while signal is None or not signal.aborted:
                found = try_once(self, key, ttl_ms, label, use, permits, max_hold_ms)
                if isinstance(found, Lock):
                    return told_acquired(self, found, began)
                remaining = give_up - self.clock.monotonic()
                if remaining <= 0:
                    break
                self._pause(key, min(POLICY.backoff(attempt), remaining), signal)
                attempt += 1
        except StoreError:
            told_not_acquired(self, key, label, use, "error", began)
            raise
        told_not_acquired(self, key, label, use, _gave_up(signal), began)
        return found

    def lock(
        self,
        key: str,
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
        permits: int = 1,
        max_hold: Duration | None = None,
        release: Release = "on_exit",
        using: str | None = None,
        label: str | None = None,
    ) -> LockBlock:
        """A context manager holding ``key`` for its block, yielding the ``Lock``.

        Raises ``LockNotAcquiredError`` when the key stayed taken; releases on exit, also when the
        block raises. Inside, ``current_lock()`` is this lock. ``async with locks.alock(...)`` for
        coroutines. ``label`` and ``max_hold`` as for :meth:`acquire`.

        ``release="on_commit"``: a block that ends inside ``transaction.atomic()`` on ``using``
        is released right after that transaction commits, renewed until then, and at once when
        it (or an enclosing savepoint) rolls back or its connection closes; a block ending
        outside one is released at once. ``using``: the alias whose transaction it follows
        (default: a ``DatabaseStore``'s own alias, ``"default"`` for other stores). A block
        inside transactions on other aliases too is refused (``TransactionManagementError``).
        ``ValueError`` for another ``release`` or an alias not in ``DATABASES``.
        """
        ttl_ms, wait_s, permits, hold_ms = self._check(key, ttl, wait, signal, permits, max_hold)
        alias = commit_alias(self.store, using) if check_release(release, using) else None
        return LockBlock(
            self, key, ttl_ms, wait_s, signal, check_label(label), permits, hold_ms, alias
        )

    def with_lock(
        self,
        key: str,
        fn: Callable[[], T],
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
        permits: int = 1,
        max_hold: Duration | None = None,
        release: Release = "on_exit",
        using: str | None = None,
        label: str | None = None,
    ) -> T:
        """Run ``fn()`` holding ``key``; return its result (``LockNotAcquiredError`` if taken).
        ``release`` and ``using`` as for :meth:`lock`."""
        if not callable(fn):
            raise TypeError(f"`fn` must be callable, got {fn!r}")
        with self.lock(
            key,
            ttl=ttl,
            wait=wait,
            signal=signal,
            permits=permits,
            max_hold=max_hold,
            release=release,
            using=using,
            label=label,
        ):
            return fn()

    # Asynchronous twins: store calls run in threads, waiting uses the event loop.

    async def aacquire(
        self,
        key: str,
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
        permits: int = 1,
        max_hold: Duration | None = None,
        release: Release = "on_exit",
        using: str | None = None,
        label: str | None = None,
    ) -> Lock | None:
        """:meth:`acquire` for coroutines: store calls run in threads, and a waiter is woken
        by the store's release notices as a thread is. Cancelled at any point, it releases
        what it got. ``release="on_commit"`` is a ``TypeError`` (Django has no async
        ``atomic()``)."""
        refuse_async(release, using, "aacquire()")
        ttl_ms, wait_s, permits, hold_ms = self._check(key, ttl, wait, signal, permits, max_hold)
        found = await self._aacquire(
            key, ttl_ms, wait_s, signal, check_label(label), permits=permits, max_hold_ms=hold_ms
        )
        return _lock_only(found)

    async def _aacquire(
        self,
        key: str,
        ttl_ms: int,
        wait_s: float,
        signal: AbortSignal | None,
        label: str | None = None,
        use: Use = "acquire",
        *,
        permits: int = 1,
        max_hold_ms: int | None = None,
    ) -> Lock | Holder | None:
        """:meth:`aacquire` with its arguments checked already (answers as :meth:`_acquire`)."""
        began = self.clock.monotonic()
        give_up = began + wait_s
        attempt = 0
        tried = False  # the last pause made the next try already
        found: Lock | Holder | None = None
        label = label_of(key) if label is None else label
        try:
            while signal is None or not signal.aborted:
                if not tried:
                    found = await self._atry(key, ttl_ms, label, use, permits, max_hold_ms)
                if isinstance(found, Lock):
                    return told_acquired(self, found, began)
                remaining = give_up - self.clock.monotonic()
                if remaining <= 0:
                    break
                pause = min(POLICY.backoff(attempt), remaining)
                tried, answer = await self._apause(
                    key,
                    pause,
                    signal,
                    lambda: try_once(self, key, ttl_ms, label, use, permits, max_hold_ms),
                )
                if tried:
                    found = answer
                if isinstance(found, Lock):
                    return told_acquired(self, found, began)
                attempt += 1
        except StoreError:
            told_not_acquired(self, key, label, use, "error", began)
            raise
        told_not_acquired(self, key, label, use, _gave_up(signal), began)
        return found

    def alock(
        self,
        key: str,
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
        permits: int = 1,
        max_hold: Duration | None = None,
        release: Release = "on_exit",
        using: str | None = None,
        label: str | None = None,
    ) -> LockBlock:
        """:meth:`lock` for ``async with``; ``release="on_commit"`` is a ``TypeError`` (Django
        has no async ``atomic()``)."""
        refuse_async(release, using, "alock()")
        ttl_ms, wait_s, permits, hold_ms = self._check(key, ttl, wait, signal, permits, max_hold)
        return LockBlock(self, key, ttl_ms, wait_s, signal, check_label(label), permits, hold_ms)

    async def awith_lock(
        self,
        key: str,
        fn: Callable[[], Awaitable[T]],
        *,
        ttl: Duration | None = None,
        wait: Duration = 0,
        signal: AbortSignal | None = None,
        permits: int = 1,
        max_hold: Duration | None = None,
        release: Release = "on_exit",
        using: str | None = None,
        label: str | None = None,
    ) -> T:
        """Await ``fn()`` holding ``key``; return its result (``LockNotAcquiredError``: taken).
        ``release="on_commit"`` is a ``TypeError`` (Django has no async ``atomic()``)."""
        refuse_async(release, using, "awith_lock()")
        if not callable(fn):
            raise TypeError(f"`fn` must be callable, got {fn!r}")
        async with self.alock(
            key, ttl=ttl, wait=wait, signal=signal, permits=permits, max_hold=max_hold, label=label
        ):
            return await fn()

    # Internals.

    def _pause(self, key: str, seconds: float, signal: AbortSignal | None) -> None:
        """Wait before the next try: woken by the store's release notice where it offers one
        (real time only), else sleeping through the backoff; early when ``signal`` aborts."""
        if self._notified and self.clock is system_clock:
            until = time.monotonic() + seconds
            waited = wait_for_release(self.store, self.key_prefix + key, until, stop=signal)
            if waited == "no notices":
                self._notified = False  # the next pauses sleep without asking the store
            return
        self.clock.sleep(seconds, signal)

    async def _apause(
        self,
        key: str,
        seconds: float,
        signal: AbortSignal | None,
        again: Callable[[], Lock | Holder | None],
    ) -> tuple[bool, Lock | Holder | None]:
        """:meth:`_pause` for coroutines, on the event loop. Woken by a release notice, it
        comes back with the next try made (``(True, its answer)``; made by the thread that
        got the notice, at once: ``again``); else ``(False, None)`` once ``seconds`` passed."""
        notices = self._notices
        if self._notified and notices.supported and self.clock is system_clock:
            return await notices.wait(self.key_prefix + key, seconds, signal, again, self._discard)
        await self.clock.asleep(seconds, signal)
        return False, None

    def _discard(self, found: Lock | Holder | None) -> None:
        """Release, off the event loop, a lock its cancelled acquirer will never see."""
        if isinstance(found, Lock):
            self.clock.spawn(found.release)

    def _check(
        self,
        key: object,
        ttl: Duration | None,
        wait: Duration,
        signal: object,
        permits: object = 1,
        max_hold: Duration | None = None,
    ) -> tuple[int, float, int, int | None]:
        # The common `permits=1` skips the checks; a slot key counts towards the 500 characters,
        # and so does the key prefix.
        count = 1 if type(permits) is int and permits == 1 else check_permits(permits)
        validate_key(key, suffix=permit_suffix(count))
        if self.key_prefix:
            assert isinstance(key, str)
            _check_room(key, self.key_prefix, permit_suffix(count))
        ttl_ms = self.ttl_ms if ttl is None else durations.ttl_ms(ttl)
        # The common `wait=0` skips parsing; `False` (== 0) is refused like `True`.
        wait_s = 0.0 if type(wait) is int and wait == 0 else durations.wait_ms(wait) / 1000
        if signal is not None and not isinstance(signal, AbortSignal):
            raise TypeError(f"`signal` must be an AbortSignal or None, got {signal!r}")
        hold_ms = self.max_hold_ms if max_hold is None else durations.max_hold_ms(max_hold)
        return ttl_ms, wait_s, count, hold_ms

    async def _atry(
        self, key: str, ttl_ms: int, label: str, use: Use, permits: int, max_hold_ms: int | None
    ) -> Lock | Holder | None:
        """One try in a thread. When the awaiting task is cancelled mid-call, the lock the call
        gets is released (whichever side sees it last: the thread's answer, or the cancelled
        task)."""
        return await attempt(
            lambda: try_once(self, key, ttl_ms, label, use, permits, max_hold_ms), self._discard
        )

    def _preempt(self, key: str) -> int | None:
        """Ask the live holder of ``key`` to give it up (``on_conflict="replace"``): the token
        the request names, or ``None`` when nothing holds the key. Refuses a store without
        preempt requests (``ImproperlyConfigured``, before any I/O)."""
        if not self.store.supports_preempt:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(
                f"on_conflict='replace' needs a store offering preempt requests, and "
                f"{self.store} does not (an optional capability of the store contract): use "
                f"the database, Redis or in-memory store, or another on_conflict"
            )
        timeout = POLICY.acquire_timeout(self.ttl_ms)
        return self.store.preempt(self.key_prefix + key, timeout=timeout)


def _check_room(key: str, prefix: str, suffix: str) -> None:
    """The key prefix (and a permit's ``#<n>``) count towards a key's 500 characters."""
    room = MAX_KEY_LENGTH - len(prefix) - len(suffix)
    if len(key) > room:
        slots = f" and its permits' {suffix!r}" if suffix else ""
        raise ValueError(
            f"`key` must be 1 to {room} characters under the key prefix {prefix!r}{slots} "
            f"(they count towards the {MAX_KEY_LENGTH} characters of a key), got {len(key)}: "
            f"{key[:40]!r}...; shorten the key or LOCKS['KEY_PREFIX']"
        )


def _gave_up(signal: AbortSignal | None) -> str:
    """Why an acquire ended without the lock: its signal aborted, or the key stayed taken."""
    return "aborted" if signal is not None and signal.aborted else "taken"


def _lock_only(found: Lock | Holder | None) -> Lock | None:
    return found if isinstance(found, Lock) else None


_default = DefaultLocks()
locks: Locks = _default  # type: ignore[assignment]


def forget_default() -> None:
    """Close and forget the default service (``LOCKS`` changed): the next use builds it anew."""
    _default._reset()
