"""ManualClock against server stores: expiry, takeover and renewal on PostgreSQL and Redis with
no sleeping (the stores' warp() moves their leases with the clock, SPEC section 7)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from django_locks import Locks
from django_locks.exceptions import LockLostError
from django_locks.stores import InMemoryStore, LockStore
from django_locks.stores.database import DatabaseStore
from django_locks.testing import ManualClock


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
        "sqlite",
    ]
)
def store(request: pytest.FixtureRequest) -> Iterator[LockStore]:
    made: LockStore
    if request.param == "postgres":
        request.getfixturevalue("transactional_db")
        made = DatabaseStore("postgres")
    elif request.param == "redis":
        from django_locks.stores.redis import RedisStore

        made = RedisStore(url=request.getfixturevalue("redis_server").url)
    else:
        request.getfixturevalue("transactional_db")
        made = DatabaseStore("default")
    yield made
    made.close()


def _key() -> str:
    return f"travel:{uuid.uuid4().hex[:8]}"


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_a_paused_holder_is_taken_over_and_learns_it_without_sleeping(store: LockStore) -> None:
    clock = ManualClock(stores=[store])
    holder_clock = ManualClock()
    paused = Locks(store, ttl="30s", clock=holder_clock)  # its time never moves: paused
    other = Locks(store, ttl="30s", clock=clock)
    key = _key()
    started = time.monotonic()

    lock = paused.acquire(key)
    assert lock is not None
    clock.advance("29s")
    assert other.acquire(key) is None, "29 s of a 30 s lease: still held"
    clock.advance("2s")  # the lease expired on the store
    newer = other.acquire(key)
    assert newer is not None and newer.fencing_token > lock.fencing_token

    holder_clock.advance("10s")  # the holder wakes and renews: refused
    assert not lock.held
    assert isinstance(lock.signal.reason, LockLostError)
    assert lock.signal.reason.detected_by == "renewal"
    assert newer.release()
    assert time.monotonic() - started < 5, "time travel, not waiting"


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_a_renewed_lock_stays_held_through_five_minutes_of_travel(store: LockStore) -> None:
    clock = ManualClock(stores=[store])
    service = Locks(store, ttl="30s", clock=clock)
    key = _key()
    lock = service.acquire(key)
    assert lock is not None
    clock.advance("5m")  # 30 renewals, the store's leases moved between them
    assert lock.held
    assert service.acquire(key) is None
    assert lock.release()


def test_a_store_without_warp_cannot_be_attached() -> None:
    class Plain(LockStore):
        pass

    with pytest.raises(TypeError, match="warp"):
        ManualClock(stores=[Plain()])
    ManualClock(stores=[InMemoryStore()])  # it implements warp()
