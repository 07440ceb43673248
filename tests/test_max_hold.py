"""max_hold: a lock renewed for a week by a stuck job ends at its cap (SPEC section 12)."""

from __future__ import annotations

import math

import pytest

from django_locks import LockLostError, Locks
from django_locks.exceptions import StoreError
from django_locks.signals import lock_lost
from django_locks.stores import InMemoryStore
from django_locks.testing import ManualClock
from tests.helpers import recording

TTL = 30.0


class Store(InMemoryStore):
    """The in-memory store, counting renewals and failing ``leave`` when told."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.renewals = 0
        self.leave_fails = False

    def renew(self, key, owner, ttl_ms, *, timeout=None):
        self.renewals += 1
        return super().renew(key, owner, ttl_ms, timeout=timeout)

    def renew_many(self, leases, *, timeout=None):
        self.renewals += len(leases)
        return super().renew_many(leases, timeout=timeout)

    def leave(self, key, owner, ttl_ms, how, *, timeout=None):
        if self.leave_fails:
            raise StoreError("leave: store unreachable (injected)")
        return super().leave(key, owner, ttl_ms, how, timeout=timeout)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> Store:
    return Store(clock)


@pytest.fixture
def service(store: Store, clock: ManualClock) -> Locks:
    return Locks(store, ttl=TTL, clock=clock)


def test_renewals_stop_at_max_hold_and_the_lease_lapses_at_its_ttl(
    service: Locks, store: Store, clock: ManualClock
) -> None:
    with recording(lock_lost) as lost:
        with service.lock("stuck", max_hold="5m") as lock:
            clock.advance(299)
            assert lock.held and not lock.signal.aborted
            clock.advance("2s")
            assert not lock.held
            reason = lock.signal.reason
            assert isinstance(reason, LockLostError) and reason.detected_by == "max_hold"
            assert "max_hold" in str(reason)
            assert [kw["detected_by"] for kw in lost] == ["max_hold"]
            # The last renewal left the lease its ttl: the work has that long to stop.
            assert service.acquire("stuck") is None
            renewals = store.renewals
            clock.advance(TTL - 2)
            assert store.renewals == renewals, "no renewal after max_hold"
            assert service.acquire("stuck") is None
            clock.advance(3)
            # The key is free within max_hold + ttl, while the stuck block still runs.
            other = service.acquire("stuck")
            assert other is not None
            other.release()
    info = store.lease("stuck", include_inactive=True)
    assert info is not None and info.state == "released"


def test_the_end_is_recorded_as_max_hold(service: Locks, store: Store, clock) -> None:
    lock = service.acquire("capped", max_hold="1m")
    assert lock is not None
    clock.advance(61)
    clock.advance(TTL + 1)
    info = store.lease("capped", include_inactive=True)
    assert info is not None and info.state == "expired" and info.ended == "max hold", info


def test_a_failed_last_renewal_leaves_the_lease_to_show_expired(
    service: Locks, store: Store, clock: ManualClock
) -> None:
    lock = service.acquire("capped", max_hold="1m")
    assert lock is not None
    store.leave_fails = True
    clock.advance(61)
    assert lock.signal.aborted and not lock.held
    clock.advance(TTL + 1)
    info = store.lease("capped", include_inactive=True)
    assert info is not None and info.ended == "expired", info


def test_the_service_default_applies_to_locks_and_an_argument_overrides_it(
    store: Store, clock: ManualClock
) -> None:
    service = Locks(store, ttl=TTL, clock=clock, max_hold="2m")
    by_default = service.acquire("a")
    longer = service.acquire("b", max_hold="10m")
    assert by_default is not None and longer is not None
    clock.advance("3m")
    assert by_default.signal.aborted and not by_default.held
    assert longer.held
    longer.release()


def test_an_owner_lease_never_takes_the_default(store: Store, clock) -> None:
    service = Locks(store, ttl=TTL, clock=clock, max_hold="1m")
    owner = service._acquire("job:owner", service.ttl_ms, 0.0, None, use="owner")
    assert owner is not None and not isinstance(owner, str)
    clock.advance("10m")
    assert getattr(owner, "held", False)


def test_a_lock_released_before_max_hold_ends_released(service: Locks, store, clock) -> None:
    with recording(lock_lost) as lost:
        with service.lock("quick", max_hold="1m"):
            clock.advance(10)
        clock.advance("5m")
    assert lost == []
    info = store.lease("quick", include_inactive=True)
    assert info is not None and info.ended == "released"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        ("10ms", ValueError),
        ("367d", ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("soon", ValueError),
        (10**400, ValueError),
    ],
)
def test_a_bad_max_hold_is_refused_naming_it(service: Locks, value: object, error) -> None:
    with pytest.raises(error, match="max_hold"):
        service.acquire("k", max_hold=value)  # type: ignore[arg-type]
    with pytest.raises(error, match="max_hold"):
        Locks(InMemoryStore(), max_hold=value)  # type: ignore[arg-type]
    assert service.acquire("k") is not None, "nothing was taken"
