"""The lock store a fault worker uses: the store's own class with one reply held back on demand,
and every acquire call timed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django_locks.holders import Holder
from django_locks.stores.base import LockStore, PermitGrant, Renewed


class Delaying(LockStore):
    """Mixed into the store's own class (:func:`build_store`), so that the worker's store *is* a
    ``DatabaseStore`` or a ``RedisStore``: every method the service calls runs the store's own
    code, and ``lock.atomic()`` finds the store it needs.

    Once armed, the next acquire (``acquire``, ``acquire_as``, ``acquire_permit``) or renewal
    (``renew``, ``renew_many``) is sent and served at once but its answer reaches the caller only
    ``delay`` seconds later: a process paused right after sending a request (the late "OK" must
    not count). Each acquire call is recorded (``acall``: when it was sent, how long the store
    took, whether it was granted): the time a competitor's acquire waited on the store, a
    pending conditional commit of ``lock.atomic()`` included."""

    _record: Callable[..., None]
    _mutex: threading.Lock
    _delay: float | None
    _depth: threading.local

    def delaying(self, record: Callable[..., None]) -> None:
        self._record = record
        self._mutex = threading.Lock()
        self._delay = None
        self._depth = threading.local()

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

    def _timed(self, key: str, call: Callable[[], Any], granted: Callable[[Any], bool]) -> Any:
        """``call()``, recorded as one ``acall`` unless it is an acquire inside another (a
        store's ``acquire`` made of its ``acquire_as``)."""
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        sent = time.monotonic()
        try:
            result = call()
        finally:
            self._depth.n = depth
        if depth == 0:
            took = time.monotonic() - sent
            self._record("acall", key=key, sent=sent, took=took, granted=granted(result))
            if granted(result):
                self._hold_back("acquire", key, sent, _shown(result))
        return result

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        return self._timed(  # type: ignore[no-any-return]
            key,
            lambda: super(Delaying, self).acquire(key, owner, ttl_ms, timeout=timeout),
            lambda token: token is not None,
        )

    def acquire_as(
        self, key: str, owner: str, ttl_ms: int, holder: Holder, *, timeout: float | None = None
    ) -> int | Holder | None:
        return self._timed(  # type: ignore[no-any-return]
            key,
            lambda: super(Delaying, self).acquire_as(key, owner, ttl_ms, holder, timeout=timeout),
            lambda token: isinstance(token, int),
        )

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
        return self._timed(  # type: ignore[no-any-return]
            key,
            lambda: super(Delaying, self).acquire_permit(
                key, owner, ttl_ms, permits, holder, timeout=timeout
            ),
            lambda grant: isinstance(grant, PermitGrant),
        )

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        sent = time.monotonic()
        renewed = super().renew(key, owner, ttl_ms, timeout=timeout)
        self._hold_back("renew", key, sent, renewed)
        return renewed

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> Sequence[Renewed]:
        sent = time.monotonic()
        renewed = super().renew_many(leases, timeout=timeout)
        self._hold_back("renew", ",".join(key for key, _, _ in leases), sent, renewed)
        return renewed


def _shown(result: object) -> object:
    return list(result) if isinstance(result, PermitGrant) else result


def build_store(spec: dict[str, Any], record: Callable[..., None]) -> Delaying:
    """From ``{"kind": "redis", "url": ...}`` (or with ``sentinels``, ``service_name`` and
    ``min_replicas`` in place of the url), ``{"kind": "postgres", "using": ..., "listen":
    ...}``, ``{"kind": "sqlite", "using": ...}`` (no release notices on SQLite) or ``{"kind":
    "etcd", "endpoints": [...]}``."""
    cls: type[LockStore]
    if spec["kind"] == "etcd":
        from django_locks.stores.etcd import EtcdStore

        cls, args = EtcdStore, {"endpoints": spec["endpoints"], "timeout": 5}
    elif spec["kind"] == "redis":
        from django_locks.stores import RedisStore

        cls, args = RedisStore, {"url": spec.get("url"), "socket_timeout": 5}
        if "sentinels" in spec:
            args |= {name: spec[name] for name in ("sentinels", "service_name", "min_replicas")}
    else:
        from django_locks.stores import DatabaseStore

        listen = spec.get("listen", True) if spec["kind"] == "postgres" else False
        cls, args = DatabaseStore, {"using": spec["using"], "listen_using": listen}
    store: Delaying = type(f"Delaying{cls.__name__}", (Delaying, cls), {})(**args)
    store.delaying(record)
    return store
