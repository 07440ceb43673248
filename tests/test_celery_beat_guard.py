"""The beat-side guard in one process: a clean handover does not publish the same tick twice; one
bad entry is refused on its own.

The scheduler here is a stand-in that records what beat would publish; the lock store is the real
in-memory one. The real beats and workers are in test_celery.py.
"""

from __future__ import annotations

import importlib
import logging
import types
from typing import Any

import pytest
from celery import Celery
from celery.local import Proxy

from django_locks import on_one_instance
from django_locks.contrib.celery import HANDBACK_GRACE, HEADER_KEY, REFUSAL_REPEAT, BeatGuard
from django_locks.contrib.celery_beat import _publishing
from tests.helpers import eventually

app = Celery("beat-guard-tests", set_as_current=False)


@app.task(name="beat_guard.export")  # type: ignore[untyped-decorator]
@on_one_instance(key="beat-guard:export")
def export() -> None: ...


def beat(published: list[tuple[str, dict[str, Any]]], name: str) -> BeatGuard:
    def apply_entry(entry: Any, producer: Any = None) -> None:
        published.append((name, dict(_publishing.get() or {})))

    scheduler = types.SimpleNamespace(app=app, apply_entry=apply_entry, close=lambda: None)
    return BeatGuard(scheduler)


def tick() -> Any:
    return types.SimpleNamespace(task="beat_guard.export", args=(), kwargs={})


def test_a_clean_handover_right_after_a_tick_does_not_publish_it_twice() -> None:
    app.finalize()
    published: list[tuple[str, dict[str, Any]]] = []
    first, second = beat(published, "first"), beat(published, "second")
    first.apply_entry(tick())  # the tick, published by the owner...
    second.apply_entry(tick())  # ...and skipped by the other beat, due at the same instant
    assert [name for name, _ in published] == ["first"]
    assert published[0][1][HEADER_KEY] == "beat-guard:export:owner"
    first.close()  # a deploy stops the owner right after it published
    second.apply_entry(tick())  # the other beat, waking a moment later for the same tick
    assert [name for name, _ in published] == ["first"]

    def second_publishes() -> bool:
        second.apply_entry(tick())
        return published[-1][0] == "second"

    took = eventually(second_publishes, timeout=HANDBACK_GRACE * 5, what="the handover")
    assert HANDBACK_GRACE * 0.5 < took < HANDBACK_GRACE * 3
    second.close()


@app.task(name="beat_guard.report")  # type: ignore[untyped-decorator]
@on_one_instance(key="beat-guard:report:{customer}")
def report(customer: str) -> None: ...


# A task beat knows only as a lazy proxy whose module fails to import when it is first looked at.
unimportable = Proxy(lambda: importlib.import_module("beat_guard_no_such_module").task)
UNIMPORTABLE = "beat_guard.unimportable"


def entry(name: str, task: str, *args: Any, **kwargs: Any) -> Any:
    return types.SimpleNamespace(name=name, task=task, args=args, kwargs=kwargs)


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and "refused, not published" in r.getMessage()
    ]


def test_one_bad_entry_is_refused_on_its_own_and_logged_once_per_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app.finalize()
    app.tasks[UNIMPORTABLE] = unimportable
    published: list[tuple[str, dict[str, Any]]] = []
    guard = beat(published, "beat")
    good = entry("report-acme", "beat_guard.report", "acme")
    too_long = entry("report-huge", "beat_guard.report", "x" * 600)
    unfit = entry("report-unfit", "beat_guard.report", "acme", "extra")
    missing = entry("unimportable", UNIMPORTABLE)
    with caplog.at_level(logging.DEBUG, logger="django_locks"):
        for _ in range(3):
            for each in (too_long, good, unfit, missing, entry("other", "beat_guard.report", "b")):
                guard.apply_entry(each)  # never raises
    keys = [headers[HEADER_KEY] for _, headers in published]
    assert keys == ["beat-guard:report:acme:owner", "beat-guard:report:b:owner"] * 3
    errors = refusals(caplog)
    assert len(errors) == 3, errors  # once per entry and error, not at every tick
    huge, unfit_error, unimportable_error = errors
    assert "Beat entry 'report-huge' (task 'beat_guard.report')" in huge
    assert "must be 1 to 500 characters once ':owner' is appended, got 624" in huge
    assert "template 'beat-guard:report:{customer}'" in huge and "Fix: give the entry" in huge
    assert "Beat entry 'report-unfit'" in unfit_error and "TypeError" in unfit_error
    assert "Beat entry 'unimportable'" in unimportable_error
    assert "ModuleNotFoundError" in unimportable_error and "import the task's module" in (
        unimportable_error
    )
    assert "Beat entry 'report-huge' is still refused" in caplog.text
    # Another error for the same entry (the schedule was edited) is logged at once.
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="django_locks"):
        guard.apply_entry(entry("report-huge", "beat_guard.report", "y" * 700))
        guard.apply_entry(entry("report-huge", "beat_guard.report", "fixed"))
    [again] = refusals(caplog)
    assert "got 724" in again
    assert "Beat entry 'report-huge' (task 'beat_guard.report') is published again" in caplog.text
    assert published[-1][1][HEADER_KEY] == "beat-guard:report:fixed:owner"
    guard.close()


def test_a_refusal_is_logged_again_after_the_repeat_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app.finalize()
    guard = beat([], "beat")
    too_long = entry("report-huge", "beat_guard.report", "x" * 600)
    now = [1000.0]
    guard.now = lambda: now[0]
    with caplog.at_level(logging.ERROR, logger="django_locks"):
        guard.apply_entry(too_long)
        now[0] += REFUSAL_REPEAT - 1
        guard.apply_entry(too_long)
        assert len(refusals(caplog)) == 1
        now[0] += 2
        guard.apply_entry(too_long)
        assert len(refusals(caplog)) == 2
    guard.close()


def test_report_and_close_survive_a_bad_entry_and_a_failing_hand_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app.finalize()
    app.tasks[UNIMPORTABLE] = unimportable
    published: list[tuple[str, dict[str, Any]]] = []
    closed: list[bool] = []
    schedule = {
        "a-unimportable": entry("a-unimportable", UNIMPORTABLE),
        "b-report": entry("b-report", "beat_guard.report", "close"),
    }
    scheduler = types.SimpleNamespace(
        app=app,
        schedule=schedule,
        apply_entry=lambda entry, producer=None: published.append(("beat", {})),
        close=lambda: closed.append(True),
    )
    guard = BeatGuard(scheduler)
    with caplog.at_level(logging.INFO, logger="django_locks"):
        guard.report()
    assert "could not look at beat entry 'a-unimportable'" in caplog.text
    assert "Beat entry 'b-report': task 'beat_guard.report' is published by" in caplog.text
    scheduler.apply_entry(schedule["b-report"])
    assert published and guard.owned

    class Broken(Exception):
        pass

    def boom(*args: Any) -> bool:
        raise Broken("not a LocksError")

    [lock] = guard.owned.values()
    # A lease whose hand-back raises something unexpected, first in line: the real one after it
    # is still handed back, and the scheduler still closed.
    broken = types.SimpleNamespace(key="beat-guard:broken:owner", leave_for=boom, release=boom)
    guard.owned = {broken.key: broken, **guard.owned}  # type: ignore[dict-item]
    with caplog.at_level(logging.INFO, logger="django_locks"):
        scheduler.close()
    assert closed == [True]  # the scheduler is still closed (its schedule synced)
    assert "Handing back 'beat-guard:broken:owner' failed; it lapses at its ttl" in caplog.text
    assert "This beat handed back 'beat-guard:report:close:owner'" in caplog.text
    assert not lock.held
