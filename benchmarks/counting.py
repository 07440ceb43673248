"""``CountingStore``: a thin wrapper that counts the calls (round trips) made to a real store."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from django.utils.module_loading import import_string

from django_locks.holders import Holder
from django_locks.stores.base import LeaseInfo, LockStore, PermitGrant, Renewed


class CountingStore(LockStore):
    """Forwards every call to the store ``backend(**options)`` and counts it, per method and
    per calling thread. Usable as ``LOCKS["BACKEND"]`` (a custom store), so that the service
    the decorators use is counted too. Each counted call is one round trip on our stores
    (``renew_many`` included: one statement on PostgreSQL, one pipeline on Redis). Permits
    are forwarded too (``acquire_permit``; a permit's ``Slot`` keys reach the store as given)."""

    def __init__(self, *, backend: str, options: dict[str, Any] | None = None) -> None:
        self.inner: LockStore = import_string(backend)(**(options or {}))
        self._mutex = threading.Lock()
        self._counts: Counter[tuple[str, int]] = Counter()
        self.renewed = 0  # leases renewed by renew / renew_many, confirmed or not
        self.batch_seconds: list[float] = []  # how long each renew_many call took

    def __repr__(self) -> str:
        return f"<CountingStore {self.inner!r}>"

    def _count(self, method: str, leases: int = 0) -> None:
        with self._mutex:
            self._counts[method, threading.get_ident()] += 1
            self.renewed += leases

    def calls(self, *methods: str, thread: int | None = None) -> int:
        """How many calls of ``methods`` (all when none), from ``thread`` (any when None)."""
        with self._mutex:
            return sum(
                count
                for (method, ident), count in self._counts.items()
                if (not methods or method in methods) and (thread is None or ident == thread)
            )

    def reset(self) -> None:
        with self._mutex:
            self._counts.clear()
            self.renewed = 0
            self.batch_seconds = []

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        self._count("acquire")
        return self.inner.acquire(key, owner, ttl_ms, timeout=timeout)

    @property
    def supports_permits(self) -> bool:  # type: ignore[override]
        return self.inner.supports_permits

    def acquire_permit(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        permits: int,
        holder: Holder,
        *,
        timeout: float | None = None,
    ) -> PermitGrant | Holder | None:
        self._count("acquire_permit")
        return self.inner.acquire_permit(key, owner, ttl_ms, permits, holder, timeout=timeout)

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        self._count("renew", 1)
        return self.inner.renew(key, owner, ttl_ms, timeout=timeout)

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> Sequence[Renewed]:
        self._count("renew_many", len(leases))
        start = time.perf_counter()
        try:
            return self.inner.renew_many(leases, timeout=timeout)
        finally:
            with self._mutex:
                self.batch_seconds.append(time.perf_counter() - start)

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        self._count("release")
        return self.inner.release(key, owner, timeout=timeout)

    def wait_for_release(self, key: str, timeout: float) -> bool:
        self._count("wait_for_release")
        return self.inner.wait_for_release(key, timeout)

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        self._count("leases")
        return self.inner.leases(include_inactive=include_inactive)

    def clear(self) -> None:
        self.inner.clear()

    def force_release(self, key: str) -> bool:
        return self.inner.force_release(key)

    def close(self) -> None:
        self.inner.close()

    def check(self, *, databases: Iterable[str] | None = None, deploy: bool = False) -> list[Any]:
        return self.inner.check(databases=databases, deploy=deploy)
