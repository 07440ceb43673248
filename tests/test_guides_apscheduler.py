"""The APScheduler guide (docs/howto/apscheduler.rst), run as printed: its scheduler started in
several processes (the guide's gunicorn workers), ticking at the same instants, on the database
lock store on PostgreSQL.

Each process records every run of the job's work; a run belongs to the tick nearest its instant.
With ``on_one_instance`` every tick runs once across the processes, all in the owner; a worker
that stops cleanly hands the job over at the next tick; one SIGKILLed holds it until its lease
lapses (the ticks in between run nowhere, as the guide says). Without the decorator every tick
runs in every process: what the test would see if the decorator did nothing.
"""

from __future__ import annotations

import collections
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.guides.children import Children
from tests.waiting import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]

EVERY = 0.25  # seconds between ticks
TTL = 2.0  # the owner lease's ttl (LOCKS["TTL"]), seconds
CHILD = "tests.guides.apscheduler_child"


@pytest.fixture
def children(tmp_path: Path, postgres_server: Any) -> Iterator[Children]:
    from tests.tasks_app.processes import postgres_alias

    group = Children(
        tmp_path,
        postgres=postgres_alias(),
        locks={
            "BACKEND": "django_locks.stores.DatabaseStore",
            "OPTIONS": {"using": "postgres"},
            "TTL": f"{TTL}s",
        },
    )
    yield group
    print(group.destroy())  # shown by pytest for a failed test only


def start(children: Children, names: list[str], mode: str, origin: float) -> None:
    ready = len(children.runs("ready"))
    for name in names:
        children.start(name, ["-m", CHILD, mode, str(EVERY), str(origin)])
    eventually(
        lambda: len(children.runs("ready")) == ready + len(names),
        timeout=30,
        every=0.05,
        what=children.destroy,
    )


def ticks(runs: list[dict[str, Any]], origin: float) -> dict[int, list[int]]:
    """The pids that ran each tick (by the tick nearest each run's instant)."""
    by_tick: dict[int, list[int]] = collections.defaultdict(list)
    for run in runs:
        by_tick[round((run["at"] - origin) / EVERY)].append(run["pid"])
    return dict(by_tick)


def test_each_tick_runs_once_across_the_schedulers_and_moves_on_failover(
    children: Children,
) -> None:
    origin = time.time()
    start(children, ["web-1", "web-2"], "decorated", origin)
    time.sleep(8 * EVERY)
    runs = children.runs("run")
    assert len(runs) >= 6, runs
    assert all(len(pids) == 1 for pids in ticks(runs, origin).values()), ticks(runs, origin)
    (owner,) = {run["pid"] for run in runs}
    first = "web-1" if owner == children.pid("web-1") else "web-2"
    second = "web-2" if first == "web-1" else "web-1"

    # A clean stop (gunicorn's SIGTERM) hands the lease back: the other runs the next tick.
    children.signal(first, signal.SIGTERM)
    assert children.wait(first) == 0
    eventually(lambda: children.runs("run")[-1]["pid"] == children.pid(second), timeout=TTL)
    assert gap(children.runs("run"), origin, children.pid(first)) == 0  # no tick missed

    # A SIGKILLed owner cannot hand it back: its lease lapses within its ttl (its last renewal
    # was at most ttl/3 before), then the third process takes the job; the ticks in between
    # ran nowhere.
    start(children, ["web-3"], "decorated", origin)
    time.sleep(4 * EVERY)
    children.signal(second, signal.SIGKILL)
    eventually(lambda: children.runs("run")[-1]["pid"] == children.pid("web-3"), timeout=TTL + 2)
    time.sleep(4 * EVERY)
    runs = children.runs("run")
    assert all(len(pids) == 1 for pids in ticks(runs, origin).values()), ticks(runs, origin)
    missed = gap(runs, origin, children.pid(second))
    assert TTL * 2 / 3 - EVERY <= missed * EVERY <= TTL + EVERY, missed
    print(f"ticks missed after a SIGTERM: 0, after a SIGKILL: {missed} of {EVERY}s")


def gap(runs: list[dict[str, Any]], origin: float, pid: int) -> int:
    """How many ticks ran nowhere between the last run of ``pid`` and the next run elsewhere."""
    by_tick = sorted((tick, pids[0]) for tick, pids in ticks(runs, origin).items())
    last = max(tick for tick, owner in by_tick if owner == pid)
    following = min(tick for tick, owner in by_tick if tick > last)
    return following - last - 1


def test_without_the_decorator_every_process_runs_every_tick(children: Children) -> None:
    origin = time.time()
    start(children, ["web-1", "web-2"], "undecorated", origin)
    time.sleep(8 * EVERY)
    by_tick = ticks(children.runs("run"), origin)
    twice = [tick for tick, pids in by_tick.items() if len(set(pids)) == 2]
    assert len(twice) >= 6, by_tick
