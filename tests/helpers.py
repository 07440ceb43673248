"""Small test helpers: recording signals, polling, a store wrapper that injects faults."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.dispatch import Signal

from django_locks.exceptions import StoreError
from django_locks.stores.base import LockStore
from tests.waiting import eventually as eventually  # the one polling helper, re-exported here


@contextmanager
def recording(signal: Signal) -> Iterator[list[dict[str, Any]]]:
    """Collect every sending of ``signal`` (its keyword arguments) during the block."""
    received: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        kwargs.pop("signal", None)
        received.append(kwargs)

    signal.connect(receiver, weak=False)
    try:
        yield received
    finally:
        signal.disconnect(receiver)


class FaultyStore(LockStore):
    """Passes calls to a real store, except the operations told to fail or hang.

    A fault injector around a real store (the store's behaviour is the real one's); it stands in
    for "the network to the store is down" or "a call hangs".
    """

    def __init__(self, inner: LockStore) -> None:
        self.inner = inner
        self.failing: set[str] = set()
        self.hanging: set[str] = set()
        self.unhang = threading.Event()
        self.calls: list[str] = []

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(name)
        if name in self.hanging:
            self.unhang.wait(30)
        if name in self.failing:
            raise StoreError(f"{name}: store unreachable (injected)")
        return getattr(self.inner, name)(*args, **kwargs)

    def acquire(self, key, owner, ttl_ms, *, timeout=None):
        return self._call("acquire", key, owner, ttl_ms)

    def renew(self, key, owner, ttl_ms, *, timeout=None):
        return self._call("renew", key, owner, ttl_ms)

    def release(self, key, owner, *, timeout=None):
        return self._call("release", key, owner)

    def leases(self, *, include_inactive=False):
        return self.inner.leases(include_inactive=include_inactive)

    def clear(self) -> None:
        self.inner.clear()


def competitor_gets(service: Any, key: str) -> bool:
    """Whether another thread (another connection, as another process would) takes ``key`` from
    ``service`` now; it releases it again at once."""
    got: list[bool] = []

    def take() -> None:
        lock = service.acquire(key)
        got.append(lock is not None)
        if lock is not None:
            lock.release()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(15)
    return got == [True]


ON_POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]
"""The marks of a test on the configured DatabaseStore on PostgreSQL."""

SERVICE_STORES = [
    "memory",
    pytest.param("postgres", marks=ON_POSTGRES),
    pytest.param("redis", marks=pytest.mark.redis),
]
"""The params of a fixture that configures the service on each store (:func:`configure_service`)."""


def configure_service(request: pytest.FixtureRequest, settings: Any, prefix: str) -> str:
    """Point ``LOCKS`` at the store ``request.param`` names (``"memory"``: the test settings'
    in-memory store; ``"postgres"``: the DatabaseStore on the ``postgres`` alias; ``"redis"``:
    the session's redis-server under a fresh ``prefix``); return that name."""
    import uuid

    if request.param == "postgres":
        settings.LOCKS = {
            "BACKEND": "django_locks.stores.DatabaseStore",
            "OPTIONS": {"using": "postgres"},
        }
    elif request.param == "redis":
        server = request.getfixturevalue("redis_server")
        options = {"url": server.url, "prefix": f"{prefix}{uuid.uuid4().hex[:8]}"}
        settings.LOCKS = {"BACKEND": "django_locks.stores.RedisStore", "OPTIONS": options}
    return str(request.param)
