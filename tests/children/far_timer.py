"""A far timer, then the longest ttl: short locks are still renewed, and lost by their deadline.

``python -m tests.children.far_timer`` (DJANGO_SETTINGS_MODULE=tests.settings) prints ``renewed
True`` and ``lost True deadline``; test_bounds.py runs it in a process of its own, so that its
timer heap holds nothing else.
"""

from __future__ import annotations

import threading
import time

import django


def main() -> None:
    django.setup()
    from django_locks import LockLostError, Locks
    from django_locks.clock import system_clock
    from django_locks.stores import InMemoryStore
    from tests.helpers import FaultyStore

    # Beyond threading.TIMEOUT_MAX: the first wait for it used to raise OverflowError in the
    # process's one timer thread, which then died.
    system_clock.call_at(time.monotonic() + 10 * threading.TIMEOUT_MAX, lambda: None)
    time.sleep(0.2)
    store = InMemoryStore()
    service = Locks(store)
    longest = service.acquire("longest", ttl="366d")
    lock = service.acquire("short", ttl="300ms")
    assert longest is not None and lock is not None
    time.sleep(1.2)
    renewed = lock.held and [lease.key for lease in store.leases()] == ["longest", "short"]
    print("renewed", renewed)
    lock.release()

    faulty = FaultyStore(InMemoryStore())
    faulty.hanging.add("renew")  # its holder cannot renew: a paused store, a stuck network
    paused = Locks(faulty).acquire("paused", ttl="300ms")
    assert paused is not None
    lost = paused.signal.wait(3)
    reason = paused.signal.reason
    print("lost", lost, isinstance(reason, LockLostError) and reason.detected_by)
    faulty.unhang.set()
    longest.release()
    time.sleep(0.5)  # the renewal let go finishes before the interpreter shuts its pool down


if __name__ == "__main__":
    main()
