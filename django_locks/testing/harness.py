"""What every case of the store contract stands on: a store per test, keys, polling, races."""

from __future__ import annotations

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
"""Seconds a test polls for a short lease to expire before it fails."""


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

    def wait_until_expired(self, key: str, owner: str) -> None:
        """Poll until ``owner``'s lease on ``key`` expired on the store's clock.

        ``renew(..., 1)`` keeps at most 1 ms of life left, so the first poll after the lease's
        real expiry sees it gone; it never revives an expired lease.
        """
        deadline = time.monotonic() + POLL_LIMIT
        while self.store.renew(key, owner, 1):
            self.assertLess(time.monotonic(), deadline, f"{key!r} never expired")
            time.sleep(0.02)

    def race(self, calls: list[Callable[[], T]]) -> list[T]:
        """Run ``calls`` in as many threads, all starting at one barrier."""
        barrier = threading.Barrier(len(calls))

        def run(call: Callable[[], T]) -> T:
            barrier.wait(timeout=30)
            return call()

        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            return list(pool.map(run, calls))
