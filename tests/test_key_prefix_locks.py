"""KEY_PREFIX in the service: the store sees prefixed keys, people never do (SPEC section 3)."""

from __future__ import annotations

import threading
import time

import pytest
from django.test import override_settings

from django_locks import LockNotAcquiredError, Locks, locks
from django_locks.signals import lock_lost
from django_locks.stores import InMemoryStore
from django_locks.testing import ManualClock
from tests.helpers import recording

MEMORY = {"BACKEND": "django_locks.stores.InMemoryStore", "ALLOW_IN_MEMORY_STORAGE": True}


def test_the_store_sees_the_prefix_and_everything_else_the_key() -> None:
    store = InMemoryStore()
    service = Locks(store, key_prefix="shop:")
    with service.lock("report:7") as lock:
        assert lock.key == "report:7"
        assert [info.key for info in store.leases()] == ["shop:report:7"]
        assert [info.key for info in service.leases()] == ["report:7"]
        with pytest.raises(LockNotAcquiredError) as raised:
            service.lock("report:7").__enter__()
        assert raised.value.key == "report:7" and "shop:" not in str(raised.value)
    assert store.leases() == []


def test_two_prefixes_on_one_store_are_two_projects() -> None:
    store = InMemoryStore()
    shop, blog = Locks(store, key_prefix="shop:"), Locks(store, key_prefix="blog:")
    mine = shop.acquire("nightly")
    theirs = blog.acquire("nightly")
    assert mine is not None and theirs is not None, "the same key in two projects"
    assert [info.key for info in shop.leases()] == ["nightly"]
    shop.clear()
    assert theirs.held and [info.key for info in blog.leases()] == ["nightly"]
    theirs.release()


def test_permit_slots_carry_the_prefix() -> None:
    store = InMemoryStore()
    service = Locks(store, key_prefix="p:")
    held = [service.acquire("pool", permits=2) for _ in range(2)]
    assert all(held) and service.acquire("pool", permits=2) is None
    keys = sorted(info.key for info in store.leases())
    assert keys == ["p:pool", "p:pool#1", "p:pool#2"], keys
    for lock in held:
        assert lock is not None and lock.key == "pool"
        lock.release()


def test_the_prefix_counts_towards_the_500_characters() -> None:
    service = Locks(InMemoryStore(), key_prefix="x" * 10)
    longest = service.acquire("k" * 490)
    assert longest is not None
    longest.release()
    with pytest.raises(ValueError, match="key prefix 'xxxxxxxxxx'") as raised:
        service.acquire("k" * 491)
    message = str(raised.value)
    assert message.startswith("`key` must be 1 to 490 characters"), message
    assert "shorten the key or LOCKS['KEY_PREFIX']" in message
    with pytest.raises(ValueError, match="1 to 485 characters under the key prefix"):
        service.acquire("k" * 486, permits=1000)  # its slot keys end "#1000"


@pytest.mark.parametrize("prefix", [7, "a\x00", "\ud800"])
def test_a_bad_prefix_is_refused(prefix: object) -> None:
    with pytest.raises((TypeError, ValueError), match="key_prefix"):
        Locks(InMemoryStore(), key_prefix=prefix)  # type: ignore[arg-type]


def test_a_waiter_is_woken_by_the_release_of_the_prefixed_key() -> None:
    service = Locks(InMemoryStore(), key_prefix="p:")
    holder = service.acquire("k")
    assert holder is not None
    timer = threading.Timer(0.3, holder.release)
    timer.start()
    started = time.monotonic()
    waited = service.acquire("k", wait=10)
    took = time.monotonic() - started
    assert waited is not None and took < 2, took
    waited.release()


def test_a_lost_lock_is_announced_without_the_prefix() -> None:
    clock = ManualClock()
    store = InMemoryStore(clock=clock)
    service = Locks(store, ttl=30, clock=clock, key_prefix="p:")
    lock = service.acquire("k")
    assert lock is not None
    store.force_release("p:k")
    with recording(lock_lost) as lost:
        clock.advance(11)
    assert [kw["key"] for kw in lost] == ["k"]


def test_the_configured_service_takes_key_prefix_and_max_hold_from_the_setting() -> None:
    with override_settings(LOCKS={**MEMORY, "KEY_PREFIX": "site-a:", "MAX_HOLD": "2h"}):
        assert locks.key_prefix == "site-a:"
        assert locks.max_hold_ms == 2 * 3600 * 1000
        with locks.lock("job") as lock:
            assert lock.key == "job"
            assert [info.key for info in locks.store.leases()] == ["site-a:job"]
    with override_settings(LOCKS=MEMORY):
        assert locks.key_prefix == "" and locks.max_hold_ms is None
