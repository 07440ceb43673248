"""What every case of the store contract stands on: a store per test, keys, polling, races."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, TypeVar

from django.test import TransactionTestCase

from django_locks.stores.base import LockStore

T = TypeVar("T")

WEEK_MS = 7 * 24 * 3600 * 1000
POLL_LIMIT = 10.0
"""Seconds a test polls for a short lease to expire, past the longest it can live
(:meth:`ContractHarness.short_lease_life`), before it fails."""


def new_owner() -> str:
    """A fresh owner id, as a ``Lock`` makes one."""
    return uuid.uuid4().hex


class ContractHarness(TransactionTestCase):
    """The helpers of :class:`~django_locks.testing.LockStoreContract` and its case groups; the
    store, the figures and ``setUp`` are the contract class's."""

    __test__ = False

    store: LockStore
    prefix: str
    concurrent_callers: ClassVar[int]
    rounds: ClassVar[int]
    short_ttl_ms: ClassVar[int]
    ttl_granularity_ms: ClassVar[int]

    def key(self, name: str = "k") -> str:
        return self.prefix + name

    def optional(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except NotImplementedError:
            self.skipTest(f"{type(self.store).__name__} does not offer this optional capability")

    def optional_or_none(self, call: Callable[[], T]) -> T | None:
        """``call()``, or ``None`` when the store does not offer that optional capability."""
        try:
            return call()
        except NotImplementedError:
            return None

    def short_lease_life(self) -> float:
        """Seconds a lease taken with at most ``short_ttl_ms`` can live on the store:
        ``short_ttl_ms`` rounded up to ``ttl_granularity_ms``, or what the store says of it
        (``effective_ttl_ms``) when longer. A shorter ttl (1 ms) lives no longer, a store's
        minimum ttl being at most ``short_ttl_ms`` (the contract class's rule)."""
        step = self.ttl_granularity_ms
        rounded = math.ceil(self.short_ttl_ms / step) * step
        return max(rounded, self.store.effective_ttl_ms(self.short_ttl_ms)) / 1000

    def expiry_deadline(self) -> float:
        """The ``time.monotonic()`` at which polling for a lease taken now with at most
        ``short_ttl_ms`` to end gives up: ``POLL_LIMIT`` seconds after the longest it can live."""
        return time.monotonic() + self.short_lease_life() + POLL_LIMIT

    def wait_until_expired(self, key: str, owner: str) -> None:
        """Poll until ``owner``'s lease on ``key``, taken with at most ``short_ttl_ms``, expired
        on the store's clock, by reading: nothing is written to that lease.

        Each poll is ``store.lease(key)`` (one round trip; the default looks the key up in
        ``leases()``). The lease is gone once no live lease holds ``key`` or the live one is
        another owner's (taken after it expired). So the lease ends at its own ttl as the store
        keeps it, rounded up or not, and is never revived nor shortened: a ``renew(key, owner,
        1)`` probe shortened it, which a store keeping whole seconds of ttl cannot do (it rounds
        1 ms up, and the probe renewed the lease for ever).

        A store that cannot list (``lease()`` raises ``NotImplementedError``) offers no read of
        a lease: its three operations all write, and each aimed at ``key`` would change what
        the case then checks (a renewal moves the expiry; an acquire by another owner takes the
        key once free, and its release leaves a released lease where the case looks at an
        expired one). There the helper waits on a probe lease of its own instead, on a key no
        case uses: acquired now with ``short_ttl_ms``, polled by another owner's ``acquire``
        (released once it wins). It started after ``owner``'s lease on the store's clock, with a
        ttl no shorter, so it ends no sooner (a store rounds a ttl the same way each time):
        once another owner takes it, ``owner``'s lease expired too. ``key`` is never touched.
        """
        deadline = self.expiry_deadline()
        try:
            live, listed = self.store.lease(key), True
        except NotImplementedError:
            live, listed = None, False
        if not listed:
            self.wait_out_a_probe_lease(key)
        while live is not None and live.state == "held" and live.owner == owner:
            self.assertLess(time.monotonic(), deadline, f"{key!r} never expired")
            time.sleep(0.02)
            live = self.store.lease(key)

    def wait_out_a_probe_lease(self, key: str) -> None:
        """:meth:`wait_until_expired` on a store that cannot list: until a lease of
        ``short_ttl_ms`` taken now on a key of its own expired."""
        probe = self.key(f"expiry-probe:{uuid.uuid4().hex[:8]}")
        self.assertIsNotNone(self.store.acquire(probe, new_owner(), self.short_ttl_ms))
        deadline, taker = self.expiry_deadline(), new_owner()
        while self.store.acquire(probe, taker, self.short_ttl_ms) is None:
            self.assertLess(time.monotonic(), deadline, f"{key!r} never expired (nor a probe)")
            time.sleep(0.02)
        self.store.release(probe, taker)

    def race(self, calls: list[Callable[[], T]]) -> list[T]:
        """Run ``calls`` in as many threads, all starting at one barrier."""
        barrier = threading.Barrier(len(calls))

        def run(call: Callable[[], T]) -> T:
            barrier.wait(timeout=30)
            return call()

        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            return list(pool.map(run, calls))
