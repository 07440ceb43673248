"""django.tasks' uniqueness at enqueue time with real workers: ``manage.py db_worker`` processes of
django-tasks-db on the PostgreSQL test database, the database lock store on the same server
(tests/tasks_app/processes.py), enqueuer processes of tests/children/tasks_unique_enqueue.py.

Counted in django-tasks-db's own table (DBTaskResult rows); runs recorded by the task
(tests/children/tasks_unique_tasks.py) with their start and stop instants."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_locks.exceptions import AlreadyQueuedError
from tests.waiting import eventually

pytestmark = [
    pytest.mark.tasks,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]

ROOT = Path(__file__).resolve().parents[1]
ENQUEUE = [sys.executable, "-m", "tests.children.tasks_unique_enqueue"]
STORE = {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": {"using": "postgres"}}


@pytest.fixture
def workers(tmp_path: Path, postgres_server: Any) -> Iterator[Any]:
    from tests.tasks_app.processes import Workers

    group = Workers(tmp_path)
    # This process enqueues on the workers' lock store.
    with override_settings(LOCKS={**STORE, "TTL": "2s"}):
        yield group
    print(group.destroy())  # shown for a failed test only


@pytest.fixture
def unique() -> Any:
    from django_locks.contrib import tasks_unique

    return tasks_unique


@pytest.fixture
def tasks() -> Any:
    from tests.children import tasks_unique_tasks

    return tasks_unique_tasks


def rows(task: Any, name: str) -> list[Any]:
    """django-tasks-db's results of ``task`` run with ``name``, oldest first."""
    from django_tasks_db.models import DBTaskResult  # type: ignore[import-not-found,unused-ignore]

    found = DBTaskResult.objects.filter(task_path=task.module_path).order_by("enqueued_at")
    return [
        row
        for row in found
        if row.args_kwargs["kwargs"].get("name", None) == name
        or (row.args_kwargs["args"][:1] == [name])
    ]


def runs(workers: Any, name: str) -> list[tuple[float, float, str]]:
    """``(start, stop, result id)`` of each complete run of ``name``."""
    lines = [run for run in workers.runs("unique") if run["name"] == name]
    starts = {run["result"]: run["at"] for run in lines if run["event"] == "start"}
    return sorted(
        (starts[run["result"]], run["at"], run["result"]) for run in lines if run["event"] == "stop"
    )


def assert_never_two_at_once(intervals: list[tuple[float, float, str]]) -> None:
    for (_, stop, first), (start, _, second) in itertools.pairwise(intervals):
        assert start >= stop, f"{second} started at {start} before {first} stopped at {stop}"


def finished(results: list[Any], timeout: float = 60) -> None:
    def done() -> bool:
        for result in results:
            result.refresh()
        return all(result.is_finished for result in results)

    eventually(done, timeout=timeout, every=0.1, what=lambda: f"unfinished: {results}")


def logs(workers: Any) -> str:
    return "\n".join(log.read_text(errors="replace") for _, _, log in workers.started)


def test_100_concurrent_enqueues_from_4_processes_queue_one_result(
    workers: Any, tasks: Any
) -> None:
    start_at = time.time() + 4  # every child has set Django up by then
    children = [
        subprocess.Popen(
            [*ENQUEUE, "burst", "25", repr(start_at), "1h"],
            env=workers.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        outcomes.append(json.loads(out.splitlines()[-1]))
    assert [o["errors"] for o in outcomes] == [[]] * 4
    queued = [result for o in outcomes for result in o["queued"]]
    assert len(queued) == 1, outcomes
    assert sum(o["refused"] for o in outcomes) == 99
    assert [str(row.id) for row in rows(tasks.sleep_for, "burst")] == queued


def test_messages_whose_lease_lapsed_in_the_queue_are_skipped_as_duplicates(
    workers: Any, unique: Any, tasks: Any
) -> None:
    """Two messages held in the queue past their ttl, then a fresh one of the same key, then
    three workers: the fresh one runs, alone; the stale ones are skipped, each with a WARNING
    naming it and the message holding the key."""
    first = unique.enqueue_unique(tasks.sleep_for, ("stale", 1.0), ttl="1s")
    time.sleep(1.3)
    second = unique.enqueue_unique(tasks.sleep_for, ("stale", 1.0), ttl="1s")
    time.sleep(1.3)
    fresh = unique.enqueue_unique(tasks.sleep_for, ("stale", 1.0), ttl="1h")
    with pytest.raises(AlreadyQueuedError):
        unique.enqueue_unique(tasks.sleep_for, ("stale", 1.0), ttl="1h")
    for name in ("w1", "w2", "w3"):
        workers.start(name)
    finished([first, second, fresh])
    intervals = runs(workers, "stale")
    assert [result for _, _, result in intervals] == [str(fresh.id)]
    assert_never_two_at_once(intervals)
    assert [r.return_value for r in (first, second, fresh)] == [None, None, "stale"]
    text = logs(workers)
    fresh_names = (str(fresh.id), fresh.kwargs[unique.PAYLOAD]["nonce"])
    for stale in (first, second):
        [line] = [line for line in text.splitlines() if str(stale.id) in line and "lapsed" in line]
        assert line.startswith("Skipped "), line  # WARNING: tests/test_tasks_unique.py
        assert any(name in line for name in fresh_names), line
    assert len(rows(tasks.sleep_for, "stale")) == 3


def test_a_lapsed_message_whose_key_is_free_runs(workers: Any, unique: Any, tasks: Any) -> None:
    late = unique.enqueue_unique(tasks.sleep_for, ("late",), ttl="1s")
    time.sleep(1.3)
    workers.start("w1")
    finished([late])
    assert [result for _, _, result in runs(workers, "late")] == [str(late.id)]


def test_until_finished_refuses_while_the_run_runs_and_until_started_does_not(
    workers: Any, unique: Any, tasks: Any
) -> None:
    workers.start("w1")
    workers.start("w2")
    running = unique.enqueue_unique(tasks.sleep_for, ("long", 3.0), ttl="1h")
    eventually(lambda: runs_started(workers, "long"), timeout=30, what="the run to start")
    with pytest.raises(AlreadyQueuedError) as refused:
        unique.enqueue_unique(tasks.sleep_for, ("long", 3.0), ttl="1h")
    assert refused.value.holder is not None and refused.value.holder.detail == str(running.id)
    finished([running])
    again = unique.enqueue_unique(tasks.sleep_for, ("long", 0.0), ttl="1h")  # the key is free
    # report: @unique_task(key="report:{customer_id}", until="started", ttl="1h").
    report = unique.enqueue_unique(tasks.report, (5, 3.0))
    eventually(lambda: runs_started(workers, "report:5"), timeout=30, what="report to start")
    second = unique.enqueue_unique(tasks.report, (5, 0.0))  # queued while the first runs
    finished([again, report, second])
    assert len(runs(workers, "report:5")) == 2
    assert [result for _, _, result in runs(workers, "long")] == [str(running.id), str(again.id)]


def runs_started(workers: Any, name: str) -> bool:
    return any(r["name"] == name and r["event"] == "start" for r in workers.runs("unique"))
