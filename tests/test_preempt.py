"""The holder's side of on_conflict="replace": a preempt request read by its renewals."""

from __future__ import annotations

import logging

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_locks import Locks, PreemptedError
from django_locks.signals import lock_lost
from django_locks.stores import InMemoryStore
from django_locks.stores.base import LockStore
from django_locks.testing import ManualClock
from tests.helpers import recording

TTL = 30.0


class OneByOne(InMemoryStore):
    """The in-memory store without renew_many: each lock renews on its own."""

    renew_many = LockStore.renew_many  # type: ignore[assignment]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["batched", "one by one"])
def store(request: pytest.FixtureRequest, clock: ManualClock) -> InMemoryStore:
    kind = InMemoryStore if request.param == "batched" else OneByOne
    return kind(clock=clock)


@pytest.fixture
def service(store: InMemoryStore, clock: ManualClock) -> Locks:
    return Locks(store, ttl=TTL, clock=clock)


def test_the_next_renewal_aborts_the_signal_and_leaving_hands_the_key_over(
    service: Locks, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="django_locks")
    with recording(lock_lost) as lost:
        with service.lock("job") as lock:
            assert service._preempt("job") == lock.fencing_token
            assert lock.held, "told at its next renewal, within ttl/3"
            clock.advance(TTL / 3 + 0.1)
            assert not lock.held
            reason = lock.signal.reason
            assert isinstance(reason, PreemptedError) and reason.detected_by == "preempted"
            assert reason.fencing_token == lock.fencing_token
            assert service.acquire("job") is None, "it lapses at its ttl unless released"
        replacing = service.acquire("job")
        assert replacing is not None, "the block's exit released it"
        assert replacing.fencing_token > lock.fencing_token
        clock.advance(TTL * 3)
        assert replacing.held, "the request named the old token: the new holder renews"
        replacing.release()
    assert lost == [], "nothing failed: no lock_lost"
    assert "Lock preempted: key='job'" in caplog.text


def test_a_preempted_lock_not_released_lapses_at_its_ttl(service: Locks, clock) -> None:
    lock = service.acquire("job")
    assert lock is not None
    service._preempt("job")
    clock.advance(TTL / 3 + 0.1)
    assert lock.signal.aborted
    assert service.acquire("job") is None
    clock.advance(TTL)
    taken = service.acquire("job")
    assert taken is not None
    assert lock.release() is False, "its lease lapsed: the release frees nothing of `taken`"
    clock.advance(TTL)
    assert taken.held
    taken.release()


def test_a_stale_request_never_preempts_the_next_holder(service: Locks, clock) -> None:
    first = service.acquire("job")
    assert first is not None
    assert service._preempt("job") == first.fencing_token
    first.release()  # released before any renewal read the request
    second = service.acquire("job")
    assert second is not None
    clock.advance(TTL * 3)
    assert second.held and not second.signal.aborted
    second.release()


def test_nothing_held_nothing_written(service: Locks, clock) -> None:
    assert service._preempt("free") is None
    lock = service.acquire("free")
    assert lock is not None
    clock.advance(TTL)
    assert lock.held
    lock.release()


def test_under_permits_the_oldest_holder_is_preempted(service: Locks, clock) -> None:
    holders = [lock for lock in (service.acquire("pool", permits=3) for _ in range(3)) if lock]
    assert len(holders) == 3
    oldest = min(holders, key=lambda lock: lock.fencing_token)
    assert service._preempt("pool") == oldest.fencing_token
    clock.advance(TTL / 3 + 0.1)
    assert [lock.signal.aborted for lock in holders] == [lock is oldest for lock in holders]
    oldest.release()
    again = service.acquire("pool", permits=3)
    assert again is not None and again.permit == oldest.permit
    for lock in [*holders, again]:
        lock.release()


def test_a_store_without_preempt_requests_refuses_replace(clock: ManualClock) -> None:
    class Plain(InMemoryStore):
        supports_preempt = False

    with pytest.raises(ImproperlyConfigured, match="preempt requests"):
        Locks(Plain(clock=clock), clock=clock)._preempt("job")
