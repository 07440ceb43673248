"""The system clock's timer thread: timers fire on time, and a lock costs it no wake-up."""

from __future__ import annotations

import threading
import time

from django_locks.clock import _TimerThread


class CountingCondition(threading.Condition):
    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def timer_thread() -> tuple[_TimerThread, CountingCondition]:
    timers = _TimerThread()
    cond = CountingCondition(timers._lock)
    timers._cond = cond
    return timers, cond


def test_timers_fire_in_time_order_also_one_set_before_the_thread_s_wake_up() -> None:
    timers, _ = timer_thread()
    fired: list[tuple[str, float]] = []
    done = threading.Event()
    start = time.monotonic()

    def late() -> None:
        fired.append(("late", time.monotonic()))
        done.set()

    timers.call_at(start + 0.6, late)
    time.sleep(0.05)  # the thread now sleeps until the late timer
    timers.call_at(start + 0.2, lambda: fired.append(("early", time.monotonic())))
    assert done.wait(5)
    assert [name for name, _ in fired] == ["early", "late"]
    assert fired[0][1] - start >= 0.2
    assert fired[0][1] - start < 0.5  # not held back until the late one


def test_locks_taken_and_released_one_after_another_do_not_wake_the_thread_each_time() -> None:
    timers, cond = timer_thread()
    first = timers.call_at(time.monotonic() + 30, lambda: None)
    first.cancel()
    time.sleep(0.05)
    before = cond.notified
    for i in range(300):
        # What one lock does: a timer at its renewal, cancelled at its release; then the
        # process does I/O, and the timer thread gets to run.
        timers.call_at(time.monotonic() + 10 + i / 1000, lambda: None).cancel()
        time.sleep(0.001)
    # Before, each released lock left the heap empty and the next one woke the thread.
    assert cond.notified - before <= 2


def test_a_live_timer_behind_many_cancelled_ones_fires_on_time() -> None:
    timers, _ = timer_thread()
    now = time.monotonic()
    for i in range(5000):
        timers.call_at(now + 0.1 + i / 10000, lambda: None).cancel()
    fired = threading.Event()
    when = now + 0.3
    late: list[float] = []

    def fire() -> None:
        late.append(time.monotonic() - when)
        fired.set()

    timers.call_at(when, fire)
    assert fired.wait(5)
    assert 0 <= late[0] < 0.25


def test_cancelled_timers_do_not_pile_up() -> None:
    timers, _ = timer_thread()
    now = time.monotonic()
    for i in range(50_000):
        timers.call_at(now + 60 + i / 1000, lambda: None).cancel()
    assert len(timers._heap) <= 2 * _TimerThread.COMPACT_AT + 2
