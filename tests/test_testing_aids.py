"""ManualClock, reset_locks and the locks_reset pytest fixture."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from django_locks import locks
from django_locks.testing import ManualClock, reset_locks


def test_advance_fires_what_falls_due_in_order_each_at_its_instant() -> None:
    clock = ManualClock()
    fired: list[tuple[str, float]] = []

    def record(name: str) -> None:
        fired.append((name, clock.monotonic()))

    for name, when in [("c", 3.0), ("a", 1.0), ("late", 10.0), ("b", 2.0)]:
        clock.call_at(when, functools.partial(record, name))
    cancelled = clock.call_at(1.5, lambda: fired.append(("cancelled", clock.monotonic())))
    cancelled.cancel()
    clock.advance("5s")
    assert fired == [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    assert clock.monotonic() == 5.0


def test_timers_scheduled_while_advancing_fire_in_the_same_advance() -> None:
    clock = ManualClock()
    fired: list[float] = []

    def tick() -> None:
        fired.append(clock.monotonic())
        clock.call_at(clock.monotonic() + 1, tick)

    clock.call_at(1, tick)
    clock.advance(3.5)
    assert fired == [1, 2, 3]


def test_resume_after_fires_overdue_timers_late() -> None:
    clock = ManualClock()
    fired: list[float] = []
    clock.call_at(1, lambda: fired.append(clock.monotonic()))
    clock.resume_after("10s")
    assert fired == [10.0]


def test_sleep_waits_for_another_thread_to_advance() -> None:
    clock = ManualClock()
    woke = threading.Event()

    def sleep() -> None:
        clock.sleep(5)
        woke.set()

    sleeper = threading.Thread(target=sleep)
    sleeper.start()
    time.sleep(0.1)
    assert not woke.is_set()
    clock.advance(4)
    time.sleep(0.05)
    assert not woke.is_set()
    clock.advance(1)
    assert woke.wait(2)
    sleeper.join()


def test_reset_locks_frees_every_lease_and_keeps_tokens() -> None:
    lock = locks.acquire("reset:k")
    assert lock is not None
    reset_locks()
    assert not lock.held
    again = locks.acquire("reset:k")
    assert again is not None and again.fencing_token > lock.fencing_token
    again.release()


@pytest.fixture
def leftover() -> None:
    # Taken before locks_reset runs (fixtures run in order): the reset must clear it.
    locks.store.acquire("fixture:k", "someone-else", 60_000)


def test_the_locks_reset_fixture_clears_leases_before_the_test(leftover, locks_reset) -> None:
    lock = locks.acquire("fixture:k")
    assert lock is not None
    lock.release()
