"""Renewal, the holder deadline, loss detection and announcement, GC and fork safety."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from typing import Any

import pytest

from django_locks import LockLostError, Locks
from django_locks.renewal import DRIFT, MARGIN
from django_locks.signals import lock_lost
from django_locks.stores import InMemoryStore
from django_locks.stores.base import Renewed, holder_name
from django_locks.testing import ManualClock
from tests.helpers import FaultyStore, eventually, recording

TTL = 30.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(clock: ManualClock) -> FaultyStore:
    return FaultyStore(InMemoryStore(clock=clock))


@pytest.fixture
def service(store: FaultyStore, clock: ManualClock) -> Locks:
    return Locks(store, ttl=TTL, clock=clock)


def test_renewal_runs_every_third_of_the_ttl(service: Locks, store: FaultyStore, clock) -> None:
    lock = service.acquire("k")
    assert lock is not None
    clock.advance(TTL)
    assert store.calls.count("renew") == 3


def test_a_lock_renewed_for_ten_ttls_stays_held(service: Locks, store: FaultyStore, clock) -> None:
    lock = service.acquire("k")
    assert lock is not None
    with recording(lock_lost) as lost:
        for _ in range(100):
            clock.advance(TTL / 10)
            assert lock.held
            assert service.acquire("k") is None
    assert lost == []
    assert store.calls.count("renew") == 30
    assert not lock.signal.aborted


def test_a_holder_whose_clock_stands_still_loses_the_key_after_ttl(store: FaultyStore) -> None:
    store_clock = ManualClock()
    store.inner = InMemoryStore(clock=store_clock)
    paused = Locks(store, ttl=TTL, clock=ManualClock())
    other = Locks(store, ttl=TTL, clock=store_clock)
    holder = paused.acquire("k")
    assert holder is not None
    store_clock.advance(TTL - 0.001)
    assert other.acquire("k") is None
    store_clock.advance(0.001)
    taker = other.acquire("k")
    assert taker is not None and taker.fencing_token > holder.fencing_token
    # The paused holder's clock moves again: its next renewal is refused by the store.
    with recording(lock_lost) as lost:
        paused.clock.advance(TTL / 3)  # type: ignore[attr-defined]
    assert lost == [{"key": "k", "fencing_token": holder.fencing_token, "detected_by": "renewal"}]
    assert not holder.held
    assert isinstance(holder.signal.reason, LockLostError)
    assert holder.signal.reason.detected_by == "renewal"
    assert taker.held


def test_an_unreachable_store_loses_the_lock_at_the_deadline(
    service: Locks, store: FaultyStore, clock: ManualClock
) -> None:
    lock = service.acquire("k")
    assert lock is not None
    store.failing.add("renew")
    deadline = TTL * (1 - DRIFT) - MARGIN
    with recording(lock_lost) as lost:
        clock.advance(deadline - 0.001)
        assert lock.held and lost == []
        assert store.calls.count("renew") > 5  # retried, not given up
        clock.advance(0.001)
    assert not lock.held
    assert lost == [{"key": "k", "fencing_token": lock.fencing_token, "detected_by": "deadline"}]
    assert lock.signal.reason.detected_by == "deadline"


def test_a_store_error_is_retried_and_a_later_renewal_keeps_the_lock(
    service: Locks, store: FaultyStore, clock: ManualClock
) -> None:
    lock = service.acquire("k")
    assert lock is not None
    store.failing.add("renew")
    clock.advance(TTL / 2)
    store.failing.clear()
    with recording(lock_lost) as lost:
        clock.advance(TTL * 3)
    assert lost == [] and lock.held


def test_a_deadline_passed_during_a_pause_is_reported_before_anything_is_sent(
    service: Locks, store: FaultyStore, clock: ManualClock
) -> None:
    lock = service.acquire("k")
    assert lock is not None
    with recording(lock_lost) as lost:
        clock.resume_after(TTL * 2)
    assert lost[0]["detected_by"] == "deadline"
    assert "renew" not in store.calls


def test_a_release_past_the_deadline_reports_the_loss_even_before_the_timer_fired(
    service: Locks, store: FaultyStore, clock: ManualClock
) -> None:
    lock = service.acquire("k")
    assert lock is not None
    clock._now += TTL * 2  # woken from a pause: its timer thread has not run yet
    with recording(lock_lost) as lost:
        assert lock.release() is False
    assert [event["detected_by"] for event in lost] == ["deadline"]
    assert isinstance(lock.signal.reason, LockLostError)
    assert store.calls.count("release") == 1  # the lease is freed all the same (in background)


def test_the_deadline_is_counted_from_the_send_time_of_the_last_confirmed_renewal(
    service: Locks, clock: ManualClock
) -> None:
    lock = service.acquire("k")
    assert lock is not None
    assert lock.deadline == pytest.approx(TTL * (1 - DRIFT) - MARGIN)
    clock.advance(TTL / 3)
    assert lock.deadline == pytest.approx(TTL / 3 + TTL * (1 - DRIFT) - MARGIN)


def test_a_failing_receiver_is_logged_and_the_others_still_hear(
    service: Locks, store: FaultyStore, clock: ManualClock, caplog
) -> None:
    def broken(**kwargs: object) -> None:
        raise RuntimeError("receiver bug")

    lock_lost.connect(broken, weak=False)
    try:
        with recording(lock_lost) as lost:
            lock = service.acquire("k")
            store.failing.add("renew")
            clock.advance(TTL)
    finally:
        lock_lost.disconnect(broken)
    assert len(lost) == 1
    assert "receiver bug" in caplog.text
    assert lock is not None and lock.signal.aborted


def test_loss_is_logged_as_a_warning_with_all_fields(service, store, clock, caplog) -> None:
    lock = service.acquire("k")
    store.failing.add("renew")
    with caplog.at_level(logging.WARNING, logger="django_locks"):
        clock.advance(TTL)
    lost = [r for r in caplog.records if r.getMessage().startswith("Lock lost")]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING
    assert f"fencing_token={lock.fencing_token}" in lost[0].getMessage()
    assert "detected_by=deadline" in lost[0].getMessage()
    assert f"holder={holder_name()}" in lost[0].getMessage()
    assert lock.owner not in caplog.text  # the holder's secret is never logged


def test_a_garbage_collected_lock_lapses_with_a_warning(
    service: Locks, store: FaultyStore, clock: ManualClock, caplog
) -> None:
    service.acquire("k")  # the Lock is dropped at once
    gc.collect()
    assert "garbage-collected without release()" in caplog.text
    clock.advance(TTL * 2)
    assert "renew" not in store.calls
    assert service.acquire("k") is not None


# Real time: the deadline is a timer, not the thread doing the I/O.


def test_p2_the_holders_validity_ends_before_the_stores_expiry() -> None:
    store = InMemoryStore()  # its clock is time.monotonic(), like the holder's
    service = Locks(store, ttl=0.5)
    lock = service.acquire("k")
    assert lock is not None
    for _ in range(4):
        lease = store._leases["k"]
        assert lock.deadline < lease.expires_at
        time.sleep(0.2)  # renewals move both
    assert lock.release()


def test_the_deadline_fires_on_time_while_a_renewal_hangs_and_the_late_ok_does_not_count() -> None:
    store = FaultyStore(InMemoryStore())
    service = Locks(store, ttl=0.6)
    lock = service.acquire("k")
    assert lock is not None
    store.hanging.add("renew")
    aborted_at: list[float] = []
    lock.signal.add_callback(lambda _: aborted_at.append(time.monotonic()))
    started = time.monotonic()
    lock.signal.wait(5)
    lost_after = time.monotonic() - started
    assert lock.signal.reason.detected_by == "deadline"  # type: ignore[union-attr]
    expected = 0.6 * (1 - DRIFT) - MARGIN
    assert expected - 0.01 <= lost_after <= expected + 0.3, lost_after
    # The hung renewal now answers "renewed": too late to count, and the lease is handed back.
    store.hanging.clear()
    store.unhang.set()
    eventually(lambda: store.inner.leases() == [], what="the late-renewed lease is released")
    assert not lock.held


def test_real_time_renewal_keeps_many_locks_held_from_many_threads() -> None:
    service = Locks(InMemoryStore(), ttl=0.3)
    held: list[Any] = []
    errors: list[BaseException] = []

    def take(i: int) -> None:
        try:
            held.append(service.acquire(f"k{i}"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and all(lock is not None for lock in held)
    time.sleep(1.2)  # four ttls: only renewals keep them
    assert all(lock.held for lock in held)
    assert all(service.acquire(f"k{i}") is None for i in range(20))
    for lock in held:
        assert lock.release()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX only")
def test_after_fork_the_child_does_not_hold_the_parents_locks_and_renews_its_own() -> None:
    store = InMemoryStore()
    service = Locks(store, ttl=0.3)
    parent_lock = service.acquire("parent")
    assert parent_lock is not None
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code, never return into pytest
        code = 0
        try:
            if parent_lock.held or parent_lock.release():
                code = 3
            if not parent_lock.signal.aborted:
                code = 6
            child_lock = service.acquire("child")
            time.sleep(1.0)
            if child_lock is None or not child_lock.held:
                code = 4
            elif child_lock.owner[:16] == parent_lock.owner[:16]:
                code = 7  # the child must never reuse the parent's owner ids
        except BaseException:
            code = 5
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    time.sleep(0.5)
    assert parent_lock.held
    assert service.acquire("parent") is None
    assert parent_lock.release()


def test_leave_for_stops_renewing_and_leaves_the_lease_for_that_long(
    service: Locks, store: FaultyStore, clock: ManualClock
) -> None:
    lock = service.acquire("k")
    assert lock is not None
    assert lock.leave_for("5s") is True
    assert not lock.held and lock.signal.aborted
    renewals = store.calls.count("renew")
    clock.advance(4.999)
    assert service.acquire("k") is None  # still in the store
    clock.advance(0.001)
    assert store.calls.count("renew") == renewals  # nobody renewed it
    assert service.acquire("k") is not None
    assert lock.leave_for("5s") is False and lock.release() is False


class CountingStore(InMemoryStore):
    """The in-memory store, counting its round trips."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.round_trips: list[tuple[str, int]] = []

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        self.round_trips.append(("renew", 1))
        return super().renew(key, owner, ttl_ms)

    def renew_many(self, leases, *, timeout=None):
        self.round_trips.append(("renew_many", len(leases)))
        return [InMemoryStore.renew(self, *lease) for lease in leases]


def test_a_thousand_locks_are_renewed_in_one_round_trip_per_period() -> None:
    clock = ManualClock()
    store = CountingStore(clock=clock)
    service = Locks(store, ttl=TTL, clock=clock)
    held = []
    for i in range(1000):
        held.append(service.acquire(f"k{i}"))
        clock.advance(0.003)  # taken over 3 seconds: renewals fall due at 1000 instants
    store.round_trips.clear()
    clock.advance(TTL * 10)
    periods = 10 * 3
    assert all(kind == "renew_many" for kind, _ in store.round_trips)
    assert len(store.round_trips) <= 2 * periods, len(store.round_trips)
    assert sum(n for _, n in store.round_trips) >= 1000 * periods
    assert all(lock is not None and lock.held for lock in held)


def test_batched_renewal_in_real_time_from_many_threads() -> None:
    store = CountingStore()
    service = Locks(store, ttl=0.6)
    locks_held: list[Any] = []
    threads = [
        threading.Thread(target=lambda i=i: locks_held.append(service.acquire(f"k{i}")))
        for i in range(200)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.round_trips.clear()
    time.sleep(1.8)  # nine renewal periods of 0.2 s
    assert all(lock.held for lock in locks_held)
    assert len(store.round_trips) <= 2 * 9 + 2, store.round_trips
    for lock in locks_held:
        assert lock.release()


def test_a_refusal_in_a_batch_loses_only_that_lock(store: FaultyStore) -> None:
    clock = ManualClock()
    counting = CountingStore(clock=clock)
    service = Locks(counting, ttl=TTL, clock=clock)
    kept, stolen = service.acquire("kept"), service.acquire("stolen")
    assert kept is not None and stolen is not None
    counting.force_release("stolen")
    with recording(lock_lost) as lost:
        clock.advance(TTL / 3)
    assert [event["key"] for event in lost] == ["stolen"]
    assert lost[0]["detected_by"] == "renewal"
    assert kept.held and not stolen.held


def test_a_batch_round_while_a_lock_joins_does_not_lose_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow acquire (its renewal due at once) and a renewal round of the store's batch that
    takes the new lock along while it is joining: the round's confirmed renewal must not be
    overwritten by the joining lock's first timer (it was, and the lock was lost by deadline)."""
    from django_locks import renewal

    class SlowStore(InMemoryStore):
        def acquire(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None):
            time.sleep(0.15)  # more than ttl / 6: the batch takes the new lock along at once
            return super().acquire(key, owner, ttl_ms, timeout=timeout)

    real = renewal._held  # type: ignore[attr-defined]
    rounds: list[threading.Thread] = []

    class Joining(set):  # type: ignore[type-arg]
        def add(self, keeper: Any) -> None:
            real.add(keeper)
            if keeper._batch is not None and not rounds:
                rounds.append(threading.Thread(target=keeper._batch._run))
                rounds[0].start()
                rounds[0].join(0.1)  # the round answers now, unless the keeper holds it off

        def discard(self, keeper: Any) -> None:
            real.discard(keeper)

    monkeypatch.setattr(renewal, "_held", Joining())
    service = Locks(SlowStore(), ttl="600ms")
    lock = service.acquire("joining")
    assert lock is not None and rounds
    rounds[0].join(5)
    time.sleep(1.5)  # two and a half ttls: renewed all along, or lost by its deadline
    assert lock.held, lock.signal.reason
    assert lock.release()


def test_leave_for_waits_for_a_renewal_in_flight() -> None:
    """A renewal sent just before leave_for(), answered after it, would move the expiry back to
    the ttl: leave_for() lets it be answered first, so the lease stays for what it asked."""
    in_flight = threading.Event()

    class SlowRenewals(InMemoryStore):
        def renew_many(self, leases: Any, *, timeout: float | None = None) -> list[Renewed]:
            in_flight.set()
            time.sleep(0.15)
            return super().renew_many(leases, timeout=timeout)

    store = SlowRenewals()
    service = Locks(store, ttl="300ms")
    lock = service.acquire("leaving")
    assert lock is not None
    assert in_flight.wait(5), "no renewal was sent"
    assert lock.leave_for("5s")
    time.sleep(0.3)  # past when the late renewal would have cut the lease to 300 ms
    (lease,) = [lease for lease in store.leases() if lease.key == "leaving"]
    assert lease.expires_in is not None and lease.expires_in.total_seconds() > 3
