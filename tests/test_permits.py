"""Permits through the service (SPEC section 12): ``permits=`` on every lock API, renewed,
signalled, announced when lost, woken by release notices; ``limit_concurrency`` on functions,
commands and coroutines. Every case on every store offering permits (the store rules
themselves are LockStoreContract's)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given, settings
from hypothesis import strategies as st

from django_locks import (
    LockLostError,
    LockNotAcquiredError,
    Locks,
    current_lock,
    limit_concurrency,
    signals,
)
from django_locks.exceptions import PermitsMismatchError
from django_locks.keys import MAX_KEY_LENGTH, MAX_PERMITS
from django_locks.stores import DatabaseStore, InMemoryStore, LockStore
from tests.helpers import eventually, recording

ON_POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]


def key() -> str:
    return f"permits:{uuid.uuid4().hex[:10]}"


@pytest.fixture
def memory_store() -> LockStore:
    return InMemoryStore()


@pytest.fixture
def sqlite_store(transactional_db: None) -> Iterator[LockStore]:
    store = DatabaseStore("default")
    yield store
    store.clear()
    store.close()


@pytest.fixture
def pg_store(transactional_db: None) -> Iterator[LockStore]:
    store = DatabaseStore("postgres")
    yield store
    store.clear()
    store.close()


@pytest.fixture
def redis_store(redis_server: Any) -> Iterator[LockStore]:
    from django_locks.stores import RedisStore

    store = RedisStore(url=redis_server.url, prefix=f"permits{uuid.uuid4().hex[:6]}")
    yield store
    store.clear()
    store.close()


@pytest.fixture(
    params=[
        "memory_store",
        pytest.param("sqlite_store", marks=pytest.mark.django_db(transaction=True)),
        pytest.param("pg_store", marks=ON_POSTGRES),
        pytest.param("redis_store", marks=pytest.mark.redis),
    ]
)
def store(request: pytest.FixtureRequest) -> LockStore:
    store: LockStore = request.getfixturevalue(request.param)
    assert store.supports_permits, f"{store} offers permits (SPEC section 12)"
    return store


def test_at_most_n_threads_hold_a_key_with_n_permits(store: LockStore) -> None:
    service = Locks(store, ttl="10s")
    name = key()
    start = threading.Barrier(12)
    got: list[Any] = []
    mutex = threading.Lock()

    def caller() -> None:
        start.wait()
        lock = service.acquire(name, permits=5)
        with mutex:
            got.append(lock)

    threads = [threading.Thread(target=caller) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    held = [lock for lock in got if lock is not None]
    assert len(held) == 5
    assert sorted(lock.permit or 0 for lock in held) == [1, 2, 3, 4, 5]
    assert len({lock.fencing_token for lock in held}) == 5
    assert all(lock.key == name for lock in held)
    for lock in held:
        assert lock.release() is True
    again = service.acquire(name, permits=5)
    assert again is not None and again.fencing_token > max(lock.fencing_token for lock in held)
    again.release()


def test_permits_are_renewed_in_the_background_past_their_ttl(store: LockStore) -> None:
    service = Locks(store, ttl="300ms")
    name = key()
    first = service.acquire(name, permits=2)
    second = service.acquire(name, permits=2)
    assert first is not None and second is not None
    time.sleep(1.0)  # three ttls: only renewals keep them
    assert first.held and second.held
    assert service.acquire(name, permits=2) is None
    summary = store.lease(name)
    assert summary is not None and summary.state == "held" and summary.is_summary
    first.release()
    second.release()
    # Every permit freed: the key is free for any use, a plain lock included.
    plain = service.acquire(name)
    assert plain is not None
    plain.release()


def test_a_full_key_names_the_holder_whose_lease_ends_first(store: LockStore) -> None:
    service = Locks(store, ttl="20s")
    name = key()
    longer = service.acquire(name, permits=2, ttl="60s")
    shorter = service.acquire(name, permits=2, ttl="20s")
    assert longer is not None and shorter is not None
    with pytest.raises(LockNotAcquiredError) as raised:
        with service.lock(name, permits=2):
            pass
    assert str(raised.value).startswith(f"Every one of the 2 permits of {name!r} is taken")
    holder = raised.value.holder
    # Every store of this module says who holds a key (a guard here would let the case pass
    # on a store that never names the holder).
    assert holder is not None and holder.expires_at is not None
    longest = store.lease(f"{name}#{longer.permit}")
    assert longest is not None and longest.described.expires_at is not None
    assert holder.expires_at < longest.described.expires_at
    longer.release()
    shorter.release()


def test_one_key_is_used_with_one_permits_value(store: LockStore) -> None:
    service = Locks(store, ttl="10s")
    name = key()
    plain = service.acquire(name)
    assert plain is not None
    with pytest.raises(PermitsMismatchError) as raised:
        service.acquire(name, permits=3)
    assert (raised.value.permits, raised.value.live) == (3, 1)
    assert "permits=3" in str(raised.value) and "permits=1" in str(raised.value)
    plain.release()

    permit = service.acquire(name, permits=3)
    assert permit is not None
    with pytest.raises(PermitsMismatchError) as raised:
        service.acquire(name)  # a plain lock never adds a holder to a key under permits
    assert (raised.value.permits, raised.value.live) == (1, 3)
    with pytest.raises(PermitsMismatchError):
        service.acquire(name, permits=4)
    with pytest.raises(PermitsMismatchError):
        service.acquire(f"{name}#1")  # a slot's own key is not a lock of its own
    permit.release()
    assert service.acquire(name, permits=4) is not None  # no live lease: a new value is fine


def test_a_force_released_key_frees_every_permit_and_each_is_announced_lost(
    store: LockStore, caplog: pytest.LogCaptureFixture
) -> None:
    service = Locks(store, ttl="600ms")
    name = key()
    with recording(signals.lock_lost) as lost:
        held = [service.acquire(name, permits=3) for _ in range(3)]
        assert all(lock is not None for lock in held)
        assert store.force_release(name) is True
        for lock in held:
            assert lock is not None
            assert lock.signal.wait(5), "the next renewal finds the permit gone"
            assert isinstance(lock.signal.reason, LockLostError)
        eventually(lambda: len(lost) == 3)
    assert {event["key"] for event in lost} == {name}
    assert sorted(
        record.getMessage().split(" permit=")[1][0]
        for record in caplog.records
        if record.getMessage().startswith("Lock lost")
    ) == ["1", "2", "3"]
    assert service.acquire(name) is not None  # every slot and the key's record are free


def test_a_waiter_for_a_permit_is_woken_when_one_is_released(store: LockStore) -> None:
    service = Locks(store, ttl="10s")
    name = key()
    held = [service.acquire(name, permits=2) for _ in range(2)]
    assert all(lock is not None for lock in held)
    timer = threading.Timer(0.5, held[0].release)  # type: ignore[union-attr]
    timer.start()
    started = time.monotonic()
    waited = service.acquire(name, permits=2, wait="10s")
    took = time.monotonic() - started
    timer.join()
    assert waited is not None and waited.permit == held[0].permit  # type: ignore[union-attr]
    assert took < 5
    waited.release()
    held[1].release()  # type: ignore[union-attr]


def test_async_permits(store: LockStore) -> None:
    service = Locks(store, ttl="10s")
    name = key()

    async def main() -> None:
        async with service.alock(name, permits=2) as one:
            async with service.alock(name, permits=2) as two:
                assert {one.permit, two.permit} == {1, 2}
                assert await service.aacquire(name, permits=2) is None
                assert current_lock() is two
        lock = await service.aacquire(name, permits=2)
        assert lock is not None
        await lock.arelease()
        assert await service.awith_lock(name, lambda: asyncio.sleep(0, "ran"), permits=2) == "ran"

    asyncio.run(main())


@pytest.mark.usefixtures("locks_reset")
def test_limit_concurrency_runs_at_most_n_at_once() -> None:
    # The configured service (tests/settings.py: the in-memory store).
    name = key()
    running, most = [0], [0]
    mutex = threading.Lock()
    go = threading.Event()

    @limit_concurrency(f"{name}:{{part}}", permits=2)
    def work(part: str) -> str:
        if part != "a":
            return part
        with mutex:
            running[0] += 1
            most[0] = max(most[0], running[0])
        lock = current_lock()
        assert lock is not None and lock.permit in (1, 2)
        go.wait(5)
        with mutex:
            running[0] -= 1
        return part

    with recording(signals.run_skipped) as skips:
        threads = [threading.Thread(target=lambda: work("a")) for _ in range(5)]
        for thread in threads:
            thread.start()
        eventually(lambda: running[0] == 2 and len(skips) == 3)
        go.set()
        for thread in threads:
            thread.join()
        go.clear()
        # Another rendered key has permits of its own: "b" runs while "a" is full.
        full = [threading.Thread(target=lambda: work("a")) for _ in range(2)]
        for thread in full:
            thread.start()
        eventually(lambda: running[0] == 2)
        assert work("b") == "b"
        go.set()
        for thread in full:
            thread.join()
    assert most[0] == 2
    assert [event["code"] for event in skips] == ["at_capacity"] * 3
    assert {event["key"] for event in skips} == {f"{name}:a"}, skips


def test_permits_on_a_store_without_the_capability_are_refused_naming_it() -> None:
    class Plain(LockStore):
        def acquire(
            self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
        ) -> int | None:
            raise AssertionError("no I/O")

    service = Locks(Plain())
    with pytest.raises(ImproperlyConfigured, match="permits=3.*Plain.*does not"):
        service.acquire("k", permits=3)


@pytest.mark.parametrize("bad", [0, -1, MAX_PERMITS + 1, True, 2.0, "3", None])
def test_bad_permits_are_refused_before_any_io(bad: object) -> None:
    service = Locks(InMemoryStore())
    with pytest.raises((TypeError, ValueError), match="permits"):
        service.acquire("k", permits=bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="permits"):
        limit_concurrency("k", permits=bad)  # type: ignore[call-overload]
    assert service.store.leases(include_inactive=True) == []


def test_a_slot_key_counts_towards_the_500_characters() -> None:
    service = Locks(InMemoryStore())
    fits = "k" * (MAX_KEY_LENGTH - 3)  # "#10" makes 500
    lock = service.acquire(fits, permits=10)
    assert lock is not None
    lock.release()
    with pytest.raises(ValueError, match="500 characters once '#10' is appended"):
        service.acquire(fits + "k", permits=10)
    with pytest.raises(ValueError, match="500 characters"):
        limit_concurrency(fits + "k", permits=10)


@settings(max_examples=60, deadline=None)
@given(permits=st.integers(1, MAX_PERMITS), callers=st.integers(1, 12))
def test_any_permits_value_admits_min_of_permits_and_callers(permits: int, callers: int) -> None:
    service = Locks(InMemoryStore(), ttl="10s")
    locks = [service.acquire("k", permits=permits) for _ in range(callers)]
    held = [lock for lock in locks if lock is not None]
    assert len(held) == min(permits, callers)
    if permits > 1:
        assert sorted(lock.permit or 0 for lock in held) == list(range(1, len(held) + 1))
    else:
        assert all(lock.permit is None for lock in held)
    for lock in held:
        lock.release()
