"""Celery, for real: a worker and three ``celery beat`` processes, a Redis broker, a shared store.

Each beat has its own schedule file; the tasks append their runs (with beat's headers) to a file.
The takeover figures are printed (``pytest -s`` shows them) and asserted against ttl + ttl/3 with
a margin scaled by the ttl.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.celeryapp.processes import Processes, migrate
from tests.servers import IN_CI
from tests.waiting import eventually

# Each poll reads the runs file or a log: 20 a second is plenty.
wait_for = functools.partial(eventually, every=0.05)

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(180)]

TTL = 3.0
"""The owner and leader leases' ttl in these tests (seconds)."""
TAKEOVER_BOUND = (TTL + TTL / 3) * 1.25
"""ttl + ttl/3, with a margin of a quarter of it (process scheduling on a loaded 2-core CI)."""
EVERY_TICK = {
    "tick": {"task": "tick", "every": 1},
    "tock": {"task": "tests.celeryapp.tasks.tock", "every": 1, "args": [7]},
}


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("celery-db") / "template.sqlite3"
    migrate(db)
    return db


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, template_db: Path, redis_server: Any
) -> Iterator[Any]:
    """``cluster(locks=..., schedule=..., scheduler=...)`` -> Processes; all killed at teardown."""
    made: list[Processes] = []
    with redis_server.client() as client:
        client.flushall()

    def make(**kwargs: Any) -> Processes:
        broker = redis_server.url.rsplit("/", 1)[0] + "/1"
        directory = tmp_path / f"p{len(made)}"
        directory.mkdir()
        processes = Processes(directory, template_db, broker, **kwargs)
        made.append(processes)
        return processes

    yield make
    for processes in made:
        logs = processes.destroy()
        # Printed during teardown: pytest shows it only for a failed test.
        print(logs)


def redis_locks(redis_server: Any, **extra: Any) -> dict[str, Any]:
    options = {"url": redis_server.url, "prefix": f"locks{os.getpid()}"}
    return {"BACKEND": "django_locks.stores.RedisStore", "OPTIONS": options, "TTL": TTL, **extra}


def database_locks(**extra: Any) -> dict[str, Any]:
    return {"BACKEND": "django_locks.stores.DatabaseStore", "TTL": TTL, **extra}


def scheduled(run: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(run["scheduled"]).timestamp()


def assert_once_per_tick(runs: list[dict[str, Any]], *, ticks: int) -> None:
    """``ticks`` consecutive runs, published by one beat, about a second apart: never twice."""
    assert len(runs) >= ticks, runs
    window = runs[-ticks:]
    beats = {run["beat"] for run in window}
    assert len(beats) == 1, f"published by several beats: {beats}"
    times = [scheduled(run) for run in window]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.7 < gap < 1.5 for gap in gaps), f"not once per tick: gaps {gaps}"


def takeover(processes: Processes, task: str, *, ticks: int = 10) -> float:
    """Watch ``ticks`` ticks, SIGKILL the publishing beat, return how long until another beat's
    tick ran; then check the ticks go on once per tick from the new beat."""
    wait_for(lambda: len(processes.runs(task)) >= ticks, timeout=60, what=f"{ticks} {task} runs")
    start = len(processes.runs(task)) - 1
    wait_for(
        lambda: len(processes.runs(task)) >= start + ticks, timeout=ticks + 10, what="10 ticks"
    )
    assert_once_per_tick(processes.runs(task), ticks=ticks)
    owner = processes.runs(task)[-1]["beat"]
    killed_at = time.time()
    processes.kill(processes.pid_of_beat(owner))

    def resumed() -> list[dict[str, Any]]:
        return [run for run in processes.runs(task) if run["beat"] != owner]

    wait_for(lambda: bool(resumed()), timeout=TTL * 4 + 10, what="another beat took over")
    took = scheduled(resumed()[0]) - killed_at
    print(f"\n{task}: ticks resumed from another beat {took:.2f}s after SIGKILL (ttl {TTL}s)")
    wait_for(lambda: len(resumed()) >= 4, timeout=15, what="4 ticks after the takeover")
    assert_once_per_tick(resumed(), ticks=4)
    assert took < TAKEOVER_BOUND, f"takeover took {took:.2f}s, bound {TAKEOVER_BOUND:.2f}s"
    return took


def test_three_beats_publish_each_tick_once_and_a_standby_takes_over(
    cluster: Any, redis_server: Any
) -> None:
    processes = cluster(locks=redis_locks(redis_server), schedule=EVERY_TICK)
    processes.worker("w1")
    for name in ("b1", "b2", "b3"):
        processes.beat(name)
    takeover(processes, "tick")
    # The decorator above @shared_task, with a template key, is enforced by beat too.
    tocks = processes.runs("tock")
    assert tocks and {run["key"] for run in tocks} == {"tock:7:owner"}
    assert {run["n"] for run in tocks} == {7}
    ticks = processes.runs("tick")
    assert {run["key"] for run in ticks} == {"tick:owner"}  # the task's name is the default key
    tokens = [run["token"] for run in ticks]
    assert tokens == sorted(tokens) and len(set(tokens)) == 2  # one per owning beat, growing
    beat_logs = "".join(processes.log(name) for name in ("b1", "b2", "b3"))
    assert "tick runs on this instance (lease 'tick:owner', fencing token" in beat_logs
    assert "Skipped tick (key 'tick:owner'): it runs on another instance" in beat_logs
    assert "Beat entry 'tick': task 'tick' is published by the beat holding 'tick:owner'" in (
        beat_logs
    )


def test_a_beat_stopped_cleanly_hands_its_leases_back(cluster: Any, redis_server: Any) -> None:
    processes = cluster(locks=redis_locks(redis_server), schedule=EVERY_TICK)
    processes.worker("w1")
    processes.beat("b1")
    wait_for(lambda: len(processes.runs("tick")) >= 2, timeout=60, what="ticks from b1")
    processes.beat("b2")
    time.sleep(0.1)
    processes.kill("b1", signal.SIGTERM)
    stopped_at = time.time()
    wait_for(
        lambda: "handed back 'tick:owner'" in processes.log("b1"), timeout=15, what="handed back"
    )

    def from_b2() -> list[dict[str, Any]]:
        return [run for run in processes.runs("tick") if scheduled(run) > stopped_at]

    wait_for(lambda: bool(from_b2()), timeout=TTL + 15, what="b2 took over")
    took = scheduled(from_b2()[0]) - stopped_at
    print(f"\nafter a clean stop, b2 published {took:.2f}s later")
    # b2 needs no ttl to pass: it took the handed-back lease at its next tick after starting.
    assert took < TTL


def test_a_beat_that_cannot_see_a_task_says_so(cluster: Any, redis_server: Any) -> None:
    schedule = {"ghost": {"task": "tests.celeryapp.tasks.not_imported", "every": 60}}
    processes = cluster(locks=redis_locks(redis_server), schedule=schedule)
    processes.beat("b1")
    wait_for(
        lambda: (
            "names task 'tests.celeryapp.tasks.not_imported', which this beat process has "
            "not imported" in processes.log("b1")
        ),
        timeout=60,
        what="the warning at beat start",
    )


def test_one_bad_entry_is_refused_and_beat_and_the_other_entries_go_on(
    cluster: Any, redis_server: Any
) -> None:
    # Its kwargs render an owner lease key of 600 characters: before, beat exited with status 1.
    bad = {"task": "tests.celeryapp.tasks.tock", "every": 1, "kwargs": {"n": "x" * 600}}
    processes = cluster(locks=redis_locks(redis_server), schedule={"huge": bad, **EVERY_TICK})
    processes.worker("w1")
    beat = processes.beat("b1")
    wait_for(
        lambda: len(processes.runs("tick")) >= 4 and len(processes.runs("tock")) >= 4,
        timeout=60,
        what="the good entries published while the bad one is due every second",
    )
    assert beat.poll() is None, "beat exited"
    log = processes.log("b1")
    assert log.count("Beat entry 'huge' (task 'tests.celeryapp.tasks.tock') refused") == 1, log
    assert "on_one_instance key (template 'tock:{n}')" in log
    assert "must be 1 to 500 characters once ':owner' is appended, got 611" in log
    assert "Beat entry 'huge' is still refused" in log  # each later tick, at debug
    assert {run["n"] for run in processes.runs("tock")} == {7}


def test_django_celery_beat_database_scheduler(cluster: Any) -> None:
    # django-celery-beat has no release for Django 6.1 yet: locally that skips; in CI, where
    # requirements-dev.txt installs it next to Django 5.2, its absence is a failure.
    if IN_CI:
        importlib.import_module("django_celery_beat")
    else:
        pytest.importorskip("django_celery_beat")
    processes = cluster(
        locks=database_locks(),
        schedule=EVERY_TICK,
        scheduler="django_celery_beat.schedulers:DatabaseScheduler",
    )
    processes.worker("w1")
    for name in ("b1", "b2", "b3"):
        processes.beat(name)
    takeover(processes, "tick")
    assert "DatabaseScheduler" in "".join(processes.log(name) for name in ("b1", "b2", "b3"))


def test_whole_beat_leader_mode_on_the_database_store(cluster: Any) -> None:
    schedule = {**EVERY_TICK, "plain": {"task": "tests.celeryapp.tasks.plain", "every": 1}}
    processes = cluster(locks=database_locks(CELERY_BEAT_LEADER=True), schedule=schedule)
    processes.worker("w1")
    for name in ("b1", "b2", "b3"):
        processes.beat(name)
    # Every entry, decorated or not, is published once per tick by the leader.
    took = takeover(processes, "plain")
    leaders = {run["beat"] for run in processes.runs("plain")}
    assert len(leaders) == 2
    leader = processes.runs("plain")[-1]["beat"]
    for task in ("tick", "tock"):

        def led(task: str = task) -> list[dict[str, Any]]:
            return [run for run in processes.runs(task) if run["beat"] == leader]

        wait_for(lambda: len(led()) >= 4, timeout=15, what=f"{task} from the new leader")
        assert_once_per_tick(led(), ticks=4)
    assert took < TAKEOVER_BOUND
    logs = "".join(processes.log(name) for name in ("b1", "b2", "b3"))
    assert "leads 'celery-beat:celeryapp'" in logs


def test_a_beat_that_loses_its_lead_stops_publishing_and_campaigns_again(
    cluster: Any, redis_server: Any
) -> None:
    schedule = {"plain": {"task": "tests.celeryapp.tasks.plain", "every": 1}}
    # Not the SQLite file's store: a process stopped inside one of its writes holds the file's
    # write lock, and every other process waits for it to resume (docs/topics/stores.rst).
    locks = redis_locks(redis_server, CELERY_BEAT_LEADER=True)
    processes = cluster(locks=locks, schedule=schedule)
    processes.worker("w1")
    processes.beat("b1")
    processes.beat("b2")
    wait_for(lambda: len(processes.runs("plain")) >= 2, timeout=60, what="plain runs")
    leader = processes.pid_of_beat(processes.runs("plain")[-1]["beat"])
    # A long pause: the leader's lease expires and the standby leads; then it wakes up.
    processes.kill(leader, signal.SIGSTOP)
    stopped = len(processes.runs("plain"))
    wait_for(
        lambda: len(processes.runs("plain")) >= stopped + 3, timeout=TTL * 3 + 10, what="standby"
    )
    processes.kill(leader, signal.SIGCONT)
    wait_for(
        lambda: "lost the lead of 'celery-beat:celeryapp'" in processes.log(leader),
        timeout=15,
        what="the paused leader noticed",
    )
    resumed_at = time.time()
    wait_for(lambda: time.time() > resumed_at + 4, timeout=10, what="4 more ticks")
    after = [run for run in processes.runs("plain") if scheduled(run) > resumed_at]
    assert {run["beat"] for run in after} == {after[-1]["beat"]}
    assert_once_per_tick(after, ticks=3)
    assert not processes.process(leader).poll()  # it did not exit: it campaigns again


SLOW_SKIPPED = "Skipped tests.celeryapp.tasks.slow (key 'slow:job'): a run is still in progress"


def test_without_overlapping_skips_ticks_during_a_slow_run_on_every_worker(
    cluster: Any, redis_server: Any
) -> None:
    schedule = {"slow": {"task": "tests.celeryapp.tasks.slow", "every": 1, "args": [3.2]}}
    processes = cluster(locks=redis_locks(redis_server), schedule=schedule)
    workers = ("w1", "w2", "w3")
    for name in workers:
        processes.worker(name, concurrency=1)
    processes.beat("b1")
    wait_for(lambda: len(processes.runs("slow-end")) >= 2, timeout=60, what="two slow runs")
    starts, ends = processes.runs("slow-start"), processes.runs("slow-end")
    for start, end, following in zip(starts, ends, starts[1:], strict=False):
        assert start["run_lock"] == "slow:job"
        assert end["at"] <= following["at"], "two runs overlapped"
        # The next tick after a run ends runs (within a tick and a bit).
        assert following["at"] - end["at"] < 2.0
        assert following["run_token"] > start["run_token"]
    skipped = [processes.log(name).count(SLOW_SKIPPED) for name in workers]
    print(f"\nskipped ticks during slow runs, per worker: {skipped}")
    assert sum(skipped) >= 3
    # Each skip line names the holder from the failed acquire's answer: the worker process
    # running the slow task, by its task id.
    lines = [
        line
        for name in workers
        for line in processes.log(name).splitlines()
        if SLOW_SKIPPED in line
    ]
    assert all(" (held by " in line and " (celery task " in line for line in lines), lines[:3]
    # Whichever worker the broker hands a tick to during the run skips it; which one that is,
    # is the broker's choice (the runs above never overlapped on any of the three).


def test_limit_concurrency_runs_at_most_two_per_tenant_across_workers(
    cluster: Any, redis_server: Any
) -> None:
    from celery import Celery

    processes = cluster(locks=redis_locks(redis_server))
    for name in ("w1", "w2"):
        processes.worker(name, concurrency=3)
    client = Celery(broker=processes.broker)
    for _ in range(6):
        client.send_task("tests.celeryapp.tasks.limited", args=["a", 2.0])
    client.send_task("tests.celeryapp.tasks.limited", args=["b", 0.5])

    def settled() -> bool:
        ended = len(processes.runs("limited-end"))
        skipped = sum(
            processes.log(name).count("Skipped tests.celeryapp.tasks.limited (key 'limited:")
            for name in ("w1", "w2")
        )
        return ended + skipped >= 7 and ended == len(processes.runs("limited-start"))

    wait_for(settled, timeout=60, what="every limited task ran or was skipped")
    starts, ends = processes.runs("limited-start"), processes.runs("limited-end")
    instants = sorted(
        [(run["at"], 1) for run in starts if run["tenant"] == "a"]
        + [(run["at"], -1) for run in ends if run["tenant"] == "a"]
    )
    running, most = 0, 0
    for _, step in instants:
        running += step
        most = max(most, running)
    assert most == 2, instants
    assert {run["permit"] for run in starts if run["tenant"] == "a"} <= {1, 2}
    assert [run["tenant"] for run in starts].count("b") == 1  # its own permits
    assert all(run["run_lock"] in ("limited:a", "limited:b") for run in starts)


def test_a_paused_run_writes_nothing_stale_when_it_resumes(cluster: Any, redis_server: Any) -> None:
    from celery import Celery

    # Redis, not the SQLite file: a renewal stopped mid-write would hold the file's write lock.
    processes = cluster(locks=redis_locks(redis_server))
    processes.worker("w1", concurrency=2)
    processes.sql(
        "INSERT INTO testapp_stockcount (product, count, fencing_token) VALUES ('p', 0, 0)"
    )
    client = Celery(broker=processes.broker)
    pause = processes.tmp / "pause"
    pause.touch()
    client.send_task("tests.celeryapp.tasks.fenced", args=["p", 1, str(pause)])
    ready = Path(str(pause) + ".ready")
    wait_for(ready.exists, timeout=60, what="the first run started")
    pid, first_token = map(int, ready.read_text().split())
    os.kill(pid, signal.SIGSTOP)
    try:
        # Its run lock (ttl 1 s) expires while it is paused; a second run takes it and writes.
        # Until it has: one more second run sent each poll.
        def second_written() -> bool:
            if any(run.get("written") == 1 for run in processes.runs("fenced-end")):
                return True
            client.send_task("tests.celeryapp.tasks.fenced", args=["p", 2, str(pause) + "-none"])
            return False

        eventually(second_written, timeout=20, every=0.5, what="the second run wrote")
    finally:
        pause.unlink()
        os.kill(pid, signal.SIGCONT)
    wait_for(
        lambda: any(run["value"] == 1 for run in processes.runs("fenced-end")),
        timeout=20,
        what="the paused run finished",
    )
    late = next(run for run in processes.runs("fenced-end") if run["value"] == 1)
    assert late["written"] == 0
    assert late["run_token"] == first_token
    ((count, token),) = processes.sql(
        "SELECT count, fencing_token FROM testapp_stockcount WHERE product = 'p'"
    )
    assert count == 2 and token > first_token
    wait_for(
        lambda: "Lock lost: key='fenced:job'" in processes.log("w1"),
        timeout=10,
        what="the paused run's loss announced",
    )
