"""The lock store a fault worker uses, and a wrapper that holds back one reply on demand."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django_locks.holders import Holder
from django_locks.stores.base import (
    LeaveReason,
    LockStore,
    PermitGrant,
    ReleaseReason,
    Renewed,
)


def build_store(spec: dict[str, Any]) -> LockStore:
    """From ``{"kind": "redis", "url": ...}`` or ``{"kind": "postgres", "using": ...}``."""
    if spec["kind"] == "redis":
        from django_locks.stores import RedisStore

        return RedisStore(url=spec["url"], socket_timeout=5)
    from django_locks.stores import DatabaseStore

    return DatabaseStore(spec["using"], listen_using=spec.get("listen", True))


class DelayingStore(LockStore):
    """Delegates to ``inner``; once armed, the next acquire (``acquire``, ``acquire_as``,
    ``acquire_permit``) or renewal (``renew``, ``renew_many``) is sent and served at once but its
    answer reaches the caller only ``delay`` seconds later: a process paused right after sending
    a request (the late "OK" must not count).

    It forwards every method the service calls (the holder-recording acquire, ``end`` and
    ``leave``, batched renewals, permits, preempt requests), so that the workers run the
    store's own code paths, as a process of the project would."""

    def __init__(self, inner: LockStore, record: Callable[..., None]) -> None:
        self.inner = inner
        self._record = record
        self._mutex = threading.Lock()
        self._delay: float | None = None

    def arm(self, delay: float) -> None:
        with self._mutex:
            self._delay = delay

    def _hold_back(self, op: str, key: str, sent: float, result: object) -> None:
        with self._mutex:
            delay, self._delay = self._delay, None
        if delay is None:
            return
        self._record("reply_delayed", op=op, key=key, sent=sent, delay=delay, result=result)
        time.sleep(delay)

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        sent = time.monotonic()
        token = self.inner.acquire(key, owner, ttl_ms, timeout=timeout)
        if token is not None:
            self._hold_back("acquire", key, sent, token)
        return token

    def acquire_as(
        self, key: str, owner: str, ttl_ms: int, holder: Holder, *, timeout: float | None = None
    ) -> int | Holder | None:
        sent = time.monotonic()
        token = self.inner.acquire_as(key, owner, ttl_ms, holder, timeout=timeout)
        if isinstance(token, int):
            self._hold_back("acquire", key, sent, token)
        return token

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
        sent = time.monotonic()
        grant = self.inner.acquire_permit(key, owner, ttl_ms, permits, holder, timeout=timeout)
        if isinstance(grant, PermitGrant):
            self._hold_back("acquire", key, sent, list(grant))
        return grant

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        sent = time.monotonic()
        renewed = self.inner.renew(key, owner, ttl_ms, timeout=timeout)
        self._hold_back("renew", key, sent, renewed)
        return renewed

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> Sequence[Renewed]:
        sent = time.monotonic()
        renewed = self.inner.renew_many(leases, timeout=timeout)
        self._hold_back("renew", ",".join(key for key, _, _ in leases), sent, renewed)
        return renewed

    @property
    def supports_preempt(self) -> bool:  # type: ignore[override]
        return self.inner.supports_preempt

    def preempt(self, key: str, *, timeout: float | None = None) -> int | None:
        return self.inner.preempt(key, timeout=timeout)

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        return self.inner.release(key, owner, timeout=timeout)

    def end(
        self, key: str, owner: str, how: ReleaseReason, *, timeout: float | None = None
    ) -> bool:
        return self.inner.end(key, owner, how, timeout=timeout)

    def leave(
        self, key: str, owner: str, ttl_ms: int, how: LeaveReason, *, timeout: float | None = None
    ) -> bool:
        return self.inner.leave(key, owner, ttl_ms, how, timeout=timeout)

    def wait_for_release(self, key: str, timeout: float) -> bool:
        return self.inner.wait_for_release(key, timeout)

    def close(self) -> None:
        self.inner.close()
