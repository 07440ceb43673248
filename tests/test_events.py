"""The event stream (SPEC section 11): what each lock operation tells it, its bounded labels, and
that no consumer can break a lock call or stop the renewals."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_locks import Locks, on_one_instance, without_overlapping
from django_locks import events as events_module
from django_locks.events import MAX_LABEL, Event, check_label, label_of
from django_locks.exceptions import StoreError
from django_locks.ownership import release_owner_leases
from django_locks.stores import InMemoryStore
from django_locks.testing import ManualClock
from tests.helpers import FaultyStore, eventually


@pytest.fixture
def told() -> Iterator[list[Event]]:
    """Every event emitted during the test."""
    seen: list[Event] = []
    unsubscribe = events_module.subscribe(seen.append)
    yield seen
    unsubscribe()


def kinds(seen: list[Event]) -> list[tuple[str, str, str]]:
    return [(event.kind, event.label, event.outcome) for event in seen]


def test_an_acquire_and_its_release(told) -> None:
    service = Locks(InMemoryStore(), ttl="10s")
    lock = service.acquire("report:42")
    assert lock is not None
    lock.release()
    assert kinds(told) == [("acquired", "report", "acquired"), ("released", "report", "released")]
    acquired, released = told
    assert acquired.key == released.key == "report:42"
    assert acquired.use == released.use == "acquire"
    assert acquired.store == released.store == str(service.store)
    assert acquired.fencing_token == released.fencing_token == lock.fencing_token
    assert acquired.lock is lock
    assert acquired.duration is not None and 0 <= acquired.duration < 1
    assert released.duration is not None and released.duration >= 0


def test_lock_blocks_are_told_as_lock_and_the_label_given_wins(told) -> None:
    service = Locks(InMemoryStore(), ttl="10s")
    with service.lock("invoice-7", label="invoices"):
        pass
    service.with_lock("x:{y}", lambda: None)
    assert [(event.kind, event.label, event.use) for event in told] == [
        ("acquired", "invoices", "lock"),
        ("released", "invoices", "lock"),
        ("acquired", "x", "lock"),
        ("released", "x", "lock"),
    ]


def test_a_key_stayed_taken_an_abort_and_a_store_error(told) -> None:
    from django_locks import AbortSignal

    store = InMemoryStore()
    service = Locks(store, ttl="10s")
    held = service.acquire("busy")
    assert held is not None
    assert service.acquire("busy") is None
    stop = AbortSignal()
    stop.abort()
    assert service.acquire("busy", wait="1s", signal=stop) is None
    faulty = FaultyStore(InMemoryStore())
    faulty.failing.add("acquire")
    with pytest.raises(StoreError):
        Locks(faulty).acquire("broken:1")
    outcomes = [event.outcome for event in told if event.kind == "not_acquired"]
    assert outcomes == ["taken", "aborted", "error"]
    assert [event.label for event in told if event.kind == "not_acquired"][-1] == "broken"
    held.release()


def test_a_loss_is_told_once_with_what_detected_it(told, caplog) -> None:
    clock = ManualClock()
    store = InMemoryStore(clock=clock)
    service = Locks(store, ttl="1s", clock=ManualClock())  # the holder's clock pauses
    lock = service.acquire("paused:1")
    assert lock is not None
    clock.advance("2s")
    with caplog.at_level(logging.WARNING, logger="django_locks"):
        service.clock.advance("1s")  # type: ignore[attr-defined]
    lost = [event for event in told if event.kind == "lost"]
    assert [(event.key, event.outcome, event.label) for event in lost] == [
        ("paused:1", "renewal", "paused")  # its renewal found another holder
    ]
    # The logs are the stream's consumer too: the loss's line, once.
    assert sum("Lock lost: key='paused:1'" in r.getMessage() for r in caplog.records) == 1
    assert not lock.release()
    assert [event.kind for event in told].count("released") == 0


def test_renewal_rounds_are_told_with_their_round_trip(told) -> None:
    clock = ManualClock()
    service = Locks(InMemoryStore(clock=clock), ttl="3s", clock=clock)
    locks = [service.acquire(f"r:{n}") for n in range(3)]
    clock.advance("1s")
    eventually(lambda: any(event.kind == "renewed" for event in told), what="a renewal round")
    renewed = [event for event in told if event.kind == "renewed"]
    assert sum(event.count for event in renewed) == 3
    assert all(event.outcome == "renewed" and event.label == "" for event in renewed)
    for lock in locks:
        assert lock is not None
        lock.release()


def test_decorated_jobs_are_labelled_by_their_key_template(told) -> None:
    @without_overlapping("events-report:{n}", ttl="10s")
    def report(n: int) -> int:
        return n

    for n in range(10_000):
        report(n)
    labels = {event.label for event in told}
    keys = {event.key for event in told}
    assert labels == {"events-report:{n}"}  # one label for 10,000 rendered keys
    assert len(keys) == 10_000
    assert {event.use for event in told} == {"run"}


def test_a_skipped_run_is_told_with_its_code(told, locks_reset) -> None:
    from django_locks import locks

    @on_one_instance("events-nightly", ttl="10s")
    def nightly() -> None:
        pass

    other = locks.acquire("events-nightly:owner")
    assert other is not None
    try:
        assert nightly() is None
    finally:
        other.release()
    skipped = [event for event in told if event.kind == "run_skipped"]
    assert [(event.outcome, event.label, event.key) for event in skipped] == [
        ("elsewhere", "events-nightly", "events-nightly:owner")
    ]
    nightly()
    assert [event.use for event in told if event.kind == "acquired"][-1] == "owner"
    release_owner_leases()


def test_a_consumer_that_raises_breaks_no_lock_call_and_is_logged_once(caplog) -> None:
    calls: list[str] = []

    def broken(event: Event) -> None:
        calls.append(event.kind)
        raise RuntimeError("exporter bug")

    unsubscribe = events_module.subscribe(broken)
    try:
        service = Locks(InMemoryStore(), ttl="10s")
        with caplog.at_level(logging.ERROR, logger="django_locks"):
            for _ in range(3):
                with service.lock("robust"):
                    pass
    finally:
        unsubscribe()
    assert calls == ["acquired", "released"] * 3
    lines = [r for r in caplog.records if "lock event consumer" in r.getMessage()]
    assert len(lines) == 1 and "exporter bug" in (lines[0].exc_text or "")


def test_a_consumer_that_raises_on_the_renewal_thread_does_not_stop_renewals() -> None:
    """What makes the renewal thread die? Not a consumer: its rounds go on."""
    rounds: list[int] = []

    def broken(event: Event) -> None:
        if event.kind == "renewed":
            rounds.append(event.count)
            raise RuntimeError("exporter bug on the renewal thread")

    unsubscribe = events_module.subscribe(broken)
    try:
        service = Locks(InMemoryStore(), ttl="150ms")
        lock = service.acquire("renewed-through")
        assert lock is not None
        eventually(lambda: len(rounds) >= 4, timeout=10, what="four renewal rounds")
        assert lock.held
        lock.release()
    finally:
        unsubscribe()


def test_consumers_subscribe_and_unsubscribe_from_any_thread() -> None:
    seen: list[str] = []
    unsubscribes = []

    def subscribe() -> None:
        unsubscribes.append(events_module.subscribe(lambda event: seen.append(event.kind)))

    threads = [threading.Thread(target=subscribe) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    service = Locks(InMemoryStore())
    lock = service.acquire("threads")
    assert seen == ["acquired"] * 8
    for unsubscribe in unsubscribes:
        unsubscribe()
    assert lock is not None and lock.release()
    assert len(seen) == 8
    with pytest.raises(TypeError, match="`consumer` must be callable"):
        events_module.subscribe("not callable")  # type: ignore[arg-type]


@given(st.text(max_size=600))
def test_the_default_label_is_the_key_up_to_its_first_separator(key: str) -> None:
    label = label_of(key)
    assert key.startswith(label)
    assert ":" not in label and "{" not in label
    assert len(label) <= MAX_LABEL  # a key without a prefix is cut: bounded whatever it is
    rest = key[len(label) :]
    assert rest == "" or rest[0] in ":{" or len(label) == MAX_LABEL


@pytest.mark.parametrize(
    ("label", "error", "match"),
    [
        (42, TypeError, "`label` must be a str or None, got int 42"),
        (b"x", TypeError, "`label` must be a str or None"),
        ("", ValueError, f"`label` must be 1 to {MAX_LABEL} characters"),
        ("x" * (MAX_LABEL + 1), ValueError, f"got {MAX_LABEL + 1}"),
    ],
)
def test_a_bad_label_is_refused_before_any_store_call(label: Any, error: Any, match: str) -> None:
    store = FaultyStore(InMemoryStore())
    store.failing.add("acquire")  # reached only if the label were let through
    service = Locks(store)
    with pytest.raises(error, match=match):
        service.acquire("k", label=label)
    with pytest.raises(error, match=match):
        service.lock("k", label=label)
    with pytest.raises(error, match=match):
        service.with_lock("k", lambda: None, label=label)
    assert check_label("ok") == "ok" and check_label(None) is None


def test_acquires_cancelled_at_random_instants_leave_the_stream_balanced(
    told: list[Event],
) -> None:
    """Every release or loss told follows its acquire, also for the lock a cancelled acquire
    got and gave back (a held-locks gauge never drifts below what is held)."""
    import asyncio
    import random
    import time

    class Slow(InMemoryStore):
        """An acquire takes 2 ms, as a round trip does: cancellations land inside it."""

        def acquire_as(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(0.002)
            return super().acquire_as(*args, **kwargs)

    service = Locks(Slow(), ttl="10s")

    async def one(n: int) -> None:
        task = asyncio.ensure_future(service.aacquire(f"cancelled:{n % 3}", wait="50ms"))
        await asyncio.sleep(random.uniform(0, 0.006))  # mostly inside its 2 ms round trip
        task.cancel()
        try:
            lock = await task
        except asyncio.CancelledError:
            return
        if lock is not None:
            await lock.arelease()

    async def many() -> None:
        await asyncio.gather(*(one(n) for n in range(200)))
        # And one left alone, whatever the machine's speed made of the others.
        lock = await service.aacquire("cancelled:last", wait="5s")
        assert lock is not None
        await lock.arelease()

    asyncio.run(many())

    def balanced() -> bool:
        # This test's keys only: another test's forgotten lock may be collected meanwhile.
        mine = [event for event in told if event.key.startswith("cancelled:")]
        acquired = sum(event.kind == "acquired" for event in mine)
        ended = sum(event.kind in ("released", "lost") for event in mine)
        return acquired == ended

    eventually(balanced, timeout=10, what="every told acquire ended, none ended untold")
    mine = [event for event in told if event.key.startswith("cancelled:")]
    assert any(event.kind == "acquired" for event in mine), "no acquire got through at all"
