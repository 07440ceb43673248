"""Missed beat ticks, for real: two ``celery beat`` processes (the holder of the entries' owner
leases and a standby), one worker, a Redis broker, and the holder SIGKILLed again and again.

Two entries every :data:`EVERY` seconds, with owner leases of 2 s (tests/celeryapp/tasks.py):
``catch_up`` (``on_one_instance(catch_up=True)``) and ``no_catch_up``. Each run kills the holder
in one of three ways, lets the standby take both entries over, and starts a new standby in the
killed one's place (the worker and the other beat go on):

* ``before``: from this process, :data:`KILL_BEFORE` seconds before the holder's next tick. With
  ``catch_up`` the standby publishes that tick once (``django_locks_catch_up``), without it the
  standby's WARNING names it (``run_skipped`` code ``missed``) and nobody publishes it;
* ``after``: by the holder's own kill hook (tests/celeryapp/hooks.py), right after it published
  a tick of both entries: nobody publishes that tick again;
* ``record``: by the kill hook, right after the store confirmed the record of a ``catch_up`` tick,
  before it is published: the standby logs it "recorded, maybe not published", and nobody
  publishes it.

And across every run: no tick published twice, and with ``catch_up`` none missing (but the
``record`` ones, which are reported). DJANGO_LOCKS_MISSED_TICK_RUNS (default 3) is the number of
runs of each scenario; ``pytest -s`` prints the figures, and DJANGO_LOCKS_MISSED_TICK_FIGURES
names a file to write them to (JSON).

Celery's default scheduler gets an aligned schedule (tests/celeryapp/schedules.py): both beats are
due at the same even seconds, so a tick is one instant on both. django-celery-beat's
DatabaseScheduler gets its IntervalSchedule: each beat ticks where its own last run was, and
ticks are told apart with beat's tolerance of half a period (tests/beat_ticks.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests import test_celery
from tests.beat_ticks import Kill, Ticks, Verdict, judge, scheduled, summary
from tests.celeryapp.processes import Processes
from tests.servers import IN_CI
from tests.test_celery import database_locks, redis_locks
from tests.waiting import eventually

# The fixtures of the Celery tests: a template database, the processes torn down after each test.
template_db = test_celery.template_db
cluster = test_celery.cluster

RUNS = int(os.environ.get("DJANGO_LOCKS_MISSED_TICK_RUNS") or 3)
FIGURES = os.environ.get("DJANGO_LOCKS_MISSED_TICK_FIGURES")
SCENARIOS = ("before", "after", "record")
EVERY = 2.0
"""The entries' period (seconds): no shorter than the owner leases' ttl (2 s) less
:data:`KILL_BEFORE`, so that a kill before a tick misses that one tick only."""
KILL_BEFORE = 0.3
TASKS = {"catch_up": True, "no_catch_up": False}
KEYS = [f"{task}:owner" for task in TASKS]
DCB = "django_celery_beat.schedulers:DatabaseScheduler"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.celery,
    pytest.mark.redis,
    pytest.mark.timeout(240 + RUNS * len(SCENARIOS) * 45),
]

wait_for = functools.partial(eventually, every=0.05)


def schedule(aligned: bool) -> dict[str, Any]:
    return {task: {"task": task, "every": EVERY, "aligned": aligned} for task in TASKS}


class Beats:
    """The holder, the standby, and the runs of the two entries."""

    def __init__(self, processes: Processes, aligned: bool) -> None:
        self.processes = processes
        self.aligned = aligned
        self.started = 0
        self.names: list[str] = []

    def start(self) -> str:
        self.started += 1
        name = f"b{self.started}"
        self.processes.beat(name)
        self.names.append(name)
        return name

    def live(self) -> list[str]:
        return [name for name in self.names if self.processes.alive(name)]

    def runs(self) -> list[dict[str, Any]]:
        return [run for run in self.processes.runs() if run["task"] in TASKS]

    def holder(self) -> str | None:
        """The live beat that published the latest tick of both entries, once it has published
        one of each in the last period and a half; None until then."""
        latest = {}
        for run in self.runs():
            latest[run["task"]] = run
        if set(latest) != set(TASKS):
            return None
        beats = {run["beat"] for run in latest.values()}
        if len(beats) != 1 or time.time() - min(r["at"] for r in latest.values()) > EVERY * 1.5:
            return None
        name = self.processes.pid_of_beat(beats.pop())
        return name if self.processes.alive(name) else None

    def standing_by(self, name: str) -> bool:
        """Whether the beat ``name`` skipped a tick of each entry (it watches for missed ones)."""
        log = self.processes.log(name)
        return all(
            f"Skipped {task} (key '{task}:owner'): it runs on another" in log for task in TASKS
        )

    def settled(self) -> tuple[str, str]:
        """Wait for one live beat to hold both entries and the other to stand by."""

        def ready() -> tuple[str, str] | None:
            holder = self.holder()
            others = [name for name in self.live() if name != holder]
            if holder is None or len(others) != 1 or not self.standing_by(others[0]):
                return None
            return holder, others[0]

        found: list[tuple[str, str] | None] = [None]

        def seen() -> bool:
            found[0] = ready()
            return found[0] is not None

        wait_for(
            seen,
            timeout=EVERY * 4 + 30,
            what=lambda: f"a holder and a standby: {self.live()}, last runs {self.runs()[-4:]}",
        )
        assert found[0] is not None
        return found[0]

    def next_due(self, holder: str) -> float:
        """When the holder's next tick falls due, at least a little later than now."""
        if self.aligned:
            due = (math.floor(time.time() / EVERY) + 1) * EVERY
        else:
            beat = self.processes.process(holder).pid
            mine = [scheduled(r) for r in self.runs() if r["beat"].endswith(f":{beat}")]
            due = max(mine) + EVERY
        while due - KILL_BEFORE < time.time() + 0.1:
            due += EVERY
        return due

    def kill(self, scenario: str, holder: str, standby: str) -> Kill:
        """Kill ``holder`` the ``scenario`` way; return the kill, its standby log offset set."""
        processes = self.processes
        ids = {name: self.beat_id(name) for name in (holder, standby)}
        kill = Kill(scenario, ids[holder], ids[standby], 0.0)
        kill.since = len(processes.log(standby))
        if scenario == "before":
            kill.due = self.next_due(holder)
            time.sleep(max(kill.due - KILL_BEFORE - time.time(), 0))
            kill.at = time.time()
            processes.kill(holder)
        else:
            processes.arm(holder, "publish" if scenario == "after" else "record", KEYS)
            wait_for(
                lambda: not processes.alive(holder),
                timeout=EVERY * 3 + 10,
                what=f"{holder} killed itself ({scenario})",
            )
            kill.said = processes.killed(holder)
            assert kill.said is not None, f"{holder} died without its hook: {processes.log(holder)}"
            kill.at = kill.said["at"]
        return kill

    def beat_id(self, name: str) -> str:
        """A beat's ``host:pid`` as its headers say it."""
        pid = self.processes.process(name).pid
        for run in reversed(self.runs()):
            if run["beat"].endswith(f":{pid}"):
                return str(run["beat"])
        host = next(iter(self.runs()))["beat"].rsplit(":", 1)[0]
        return f"{host}:{pid}"

    def taken_over(self, kill: Kill) -> None:
        """Wait for the standby's first ordinary tick of each entry after the kill."""

        def done() -> bool:
            runs = [r for r in self.runs() if r["beat"] == kill.standby and r["catch_up"] != "1"]
            return {r["task"] for r in runs if scheduled(r) > kill.at} == set(TASKS)

        wait_for(done, timeout=EVERY * 4 + 20, what=f"the standby took over after {kill}")


def run_scenarios(processes: Processes, aligned: bool) -> list[Verdict]:
    """Every run of every scenario, on one worker and a succession of beats."""
    beats = Beats(processes, aligned)
    processes.worker("w1", concurrency=1)
    first = beats.start()
    wait_for(lambda: beats.holder() == first, timeout=60, what="the first beat publishes both")
    beats.start()
    kills: list[Kill] = []
    for _ in range(RUNS):
        for scenario in SCENARIOS:
            holder, standby = beats.settled()
            kill = beats.kill(scenario, holder, standby)
            beats.taken_over(kill)
            kill.log = processes.log(standby)
            kills.append(kill)
            beats.start()
    beats.settled()
    runs = beats.runs()
    # Everything judged, for a second look at a failure: tests.beat_ticks.rejudge(that file).
    saved = {"aligned": aligned, "kills": [dataclasses.asdict(k) for k in kills], "runs": runs}
    (processes.tmp / "kills.json").write_text(json.dumps(saved))
    ticks = Ticks(EVERY, aligned)
    verdicts = [
        judge(kill, task, catch_up, [r for r in runs if r["task"] == task], ticks)
        for kill in kills
        for task, catch_up in TASKS.items()
    ]
    for task in TASKS:
        times = sorted(scheduled(r) for r in runs if r["task"] == task)
        duplicates = ticks.duplicates(times)
        print(f"\n{task}: {len(times)} ticks published, {duplicates} published twice")
        assert duplicates == 0, f"{task}: ticks published twice over the whole test: {times}"
    return verdicts


def report(name: str, verdicts: list[Verdict]) -> None:
    """Print (and write, see FIGURES) the figures; fail with every run's problems."""
    figures = {
        f"{scenario} {task}": summary(
            [v for v in verdicts if v.scenario == scenario and v.task == task]
        )
        for scenario in SCENARIOS
        for task in TASKS
    }
    print(f"\n{name}: {RUNS} runs of each scenario")
    for group, numbers in figures.items():
        print(f"  {group}: " + ", ".join(f"{k} {v}" for k, v in numbers.items()))
    if FIGURES:
        path = Path(FIGURES)
        known = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**known, name: figures}, indent=2))
    problems = ["\n  ".join(v.problems) for v in verdicts if v.problems]
    assert not problems, f"{len(problems)} of {len(verdicts)} verdicts failed:\n" + "\n".join(
        problems
    )


def dcb_or_skip() -> None:
    # As tests/test_celery.py: locally a missing django-celery-beat skips, in CI it fails.
    if IN_CI:
        importlib.import_module("django_celery_beat")
    else:
        pytest.importorskip("django_celery_beat")


@pytest.mark.parametrize("store", ["redis", "database"])
def test_default_scheduler(cluster: Any, redis_server: Any, store: str) -> None:
    locks = redis_locks(redis_server) if store == "redis" else database_locks()
    processes = cluster(locks=locks, schedule=schedule(aligned=True), hooks=True)
    report(f"default scheduler, {store} store", run_scenarios(processes, aligned=True))


@pytest.mark.parametrize("store", ["redis", "database"])
def test_database_scheduler(cluster: Any, redis_server: Any, store: str) -> None:
    dcb_or_skip()
    locks = redis_locks(redis_server) if store == "redis" else database_locks()
    processes = cluster(locks=locks, schedule=schedule(aligned=False), scheduler=DCB, hooks=True)
    report(f"DatabaseScheduler, {store} store", run_scenarios(processes, aligned=False))
