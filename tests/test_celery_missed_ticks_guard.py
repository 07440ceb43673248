"""Missed ticks in one process: what a standby beat reports and publishes when it takes an entry
over from a beat that died (its lease's renewals stopped without any I/O, as a SIGKILL leaves
it), on the real in-memory store. The scheduler is a stand-in recording what beat would publish;
the real beats, worker and kills are in test_celery_missed_ticks.py.
"""

from __future__ import annotations

import datetime
import logging
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.schedules import schedule

from django_locks import on_one_instance, signals
from django_locks.contrib.celery import HANDBACK_GRACE, BeatGuard
from django_locks.contrib.celery_beat import HEADER_CATCH_UP, HEADER_SCHEDULED, _publishing
from django_locks.lock import Lock
from django_locks.testing import reset_locks
from tests.helpers import eventually

app = Celery("missed-ticks-tests", set_as_current=False)
TTL = 0.6
PERIOD = 1.0


@app.task(name="missed.catch_up")  # type: ignore[untyped-decorator]
@on_one_instance(key="missed:catch-up", ttl=f"{int(TTL * 1000)}ms", catch_up=True)
def caught_up() -> None: ...


@app.task(name="missed.report_only")  # type: ignore[untyped-decorator]
@on_one_instance(key="missed:report-only", ttl=f"{int(TTL * 1000)}ms")
def report_only() -> None: ...


Published = list[tuple[str, dict[str, Any]]]


def beat(published: Published, name: str) -> BeatGuard:
    def apply_entry(entry: Any, producer: Any = None) -> None:
        published.append((name, dict(_publishing.get() or {})))

    scheduler = types.SimpleNamespace(
        app=app, apply_entry=apply_entry, close=lambda: None, tick=lambda: 5.0
    )
    return BeatGuard(scheduler)


def entry(task: str, period: float = PERIOD) -> Any:
    return types.SimpleNamespace(
        name=task, task=task, args=(), kwargs={}, schedule=schedule(period)
    )


def die(guard: BeatGuard) -> None:
    """The beat is killed: its leases stop being renewed, nothing is sent to the store."""
    for lock in list(guard.owned.values()):
        lock._keeper.detach("the test killed this beat")
    guard.owned = {}


def take_over(standby: BeatGuard) -> float:
    """Run the standby's scheduler loop until it holds the entry; the seconds it took."""
    assert standby.scheduler.tick() <= TTL + 0.1  # it sleeps no longer than until its check

    def holds() -> bool:
        standby.scheduler.tick()
        return bool(standby.owned)

    return eventually(holds, timeout=TTL * 5, what="the standby taking the entry over")


@pytest.fixture
def missed() -> Iterator[list[dict[str, Any]]]:
    app.finalize()
    sent: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        if kwargs.get("code") == "missed":
            sent.append(kwargs)

    reset_locks()  # every test starts with its keys free
    signals.run_skipped.connect(receive)
    yield sent
    signals.run_skipped.disconnect(receive)
    reset_locks()


def scheduled(headers: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(headers[HEADER_SCHEDULED]).timestamp()


def test_a_tick_missed_just_before_it_was_due_is_published_once_by_the_standby(
    missed: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    published: Published = []
    holder, standby = beat(published, "holder"), beat(published, "standby")
    holder.apply_entry(entry("missed.catch_up"))  # tick 0, recorded then published
    standby.apply_entry(entry("missed.catch_up"))  # tick 0 on the standby: skipped, covered
    time.sleep(PERIOD - 0.1)
    die(holder)  # killed just before tick 1
    time.sleep(0.1)
    standby.apply_entry(entry("missed.catch_up"))  # tick 1: the lease still looks held
    due = time.time()
    with caplog.at_level(logging.INFO, logger="django_locks"):
        take_over(standby)
    assert [name for name, _ in published] == ["holder", "standby"]
    late = published[1][1]
    assert late[HEADER_CATCH_UP] == "1"
    assert abs(scheduled(late) - due) < 0.05  # published as tick 1, not as now
    assert "1 tick due" in caplog.text and "is published now, late (catch_up=True)" in caplog.text
    assert missed == []  # published, so not a skipped run
    standby.apply_entry(entry("missed.catch_up"))  # the standby's next tick: published as usual
    assert [name for name, _ in published] == ["holder", "standby", "standby"]
    assert HEADER_CATCH_UP not in published[2][1]
    standby.close()


def test_a_tick_published_just_before_the_kill_is_not_published_again(
    missed: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    published: Published = []
    holder, standby = beat(published, "holder"), beat(published, "standby")
    holder.apply_entry(entry("missed.catch_up"))
    time.sleep(PERIOD)
    holder.apply_entry(entry("missed.catch_up"))  # tick 1, published...
    die(holder)  # ...and killed right after
    standby.apply_entry(entry("missed.catch_up"))  # tick 1 on the standby, a moment later
    with caplog.at_level(logging.INFO, logger="django_locks"):
        take_over(standby)
    assert [name for name, _ in published] == ["holder", "holder"]
    assert missed == []
    # The record cannot say whether the tick left the beat: the one case left open, and said.
    assert "was recorded, maybe not published" in caplog.text
    standby.close()


def test_a_kill_between_recording_and_publishing_is_reported_not_published_twice(
    missed: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    published: Published = []
    holder, standby = beat(published, "holder"), beat(published, "standby")
    holder.apply_entry(entry("missed.catch_up"))
    time.sleep(PERIOD)
    [lock] = holder.owned.values()
    assert isinstance(lock, Lock)
    recorded = time.time()
    assert holder.record_tick(lock, int(recorded * 1000))  # recorded, then killed
    die(holder)
    standby.apply_entry(entry("missed.catch_up"))
    with caplog.at_level(logging.INFO, logger="django_locks"):
        take_over(standby)
    assert [name for name, _ in published] == ["holder"]
    stamp = datetime.datetime.fromtimestamp(recorded, datetime.UTC).strftime("%H:%M:%S UTC")
    assert f"its tick due {stamp} was recorded, maybe not published" in caplog.text
    standby.close()


def test_without_catch_up_a_missed_tick_is_reported_and_not_published(
    missed: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    published: Published = []
    holder, standby = beat(published, "holder"), beat(published, "standby")
    holder.apply_entry(entry("missed.report_only"))
    time.sleep(PERIOD)
    die(holder)
    standby.apply_entry(entry("missed.report_only"))  # tick 1: skipped, nobody publishes it
    with caplog.at_level(logging.INFO, logger="django_locks"):
        take_over(standby)
    assert [name for name, _ in published] == ["holder"]
    [warning] = [r for r in caplog.records if "not published" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "1 tick due" in warning.getMessage() and "catch_up=True" in warning.getMessage()
    assert [m["key"] for m in missed] == ["missed:report-only:owner"]
    standby.close()


def test_a_holder_that_lives_on_is_not_reported(
    missed: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    published: Published = []
    holder, standby = beat(published, "holder"), beat(published, "standby")
    holder.apply_entry(entry("missed.report_only"))
    standby.apply_entry(entry("missed.report_only"))  # skipped: the holder renews
    with caplog.at_level(logging.INFO, logger="django_locks"):
        deadline = time.monotonic() + TTL * 3
        while time.monotonic() < deadline:
            standby.scheduler.tick()
            time.sleep(0.05)
    assert not standby.owned and not standby.missed.watched
    assert "not published" not in caplog.text and missed == []
    holder.close()
    standby.close()


def test_beats_ticking_at_other_instants_publish_a_handed_over_tick_once(
    missed: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    # Interval schedules are timed from each beat's start: the standby's tick can fall after the
    # hand-back grace and still be the tick the stopped beat published. The record says so.
    published: Published = []
    holder, standby = beat(published, "holder"), beat(published, "standby")
    holder.apply_entry(entry("missed.catch_up", period=4.0))
    holder.close()  # a deploy: the lease stays one second after the tick, then is free
    time.sleep(HANDBACK_GRACE + 0.3)
    with caplog.at_level(logging.INFO, logger="django_locks"):
        standby.apply_entry(entry("missed.catch_up", period=4.0))  # its tick, 1.3 s later
    assert [name for name, _ in published] == ["holder"]
    assert "recorded this tick (within half a period) and published it" in caplog.text
    assert missed == []
    standby.close()
