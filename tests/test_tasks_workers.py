"""django.tasks with real workers: several ``manage.py db_worker`` processes of django-tasks-db
racing on the PostgreSQL test database, the database lock store on the same server.

The tasks (tests/tasks_app/tasks.py) record when each run started and ended; the runs of one
key must never overlap (``without_overlapping``) or exceed the permits (``limit_concurrency``),
while several workers did take runs. ``on_conflict="retry"`` is followed result by result in
django-tasks-db's table: each retry is a new result with a later ``run_after`` and the count in
``_django_locks_retries``, and past ``max_retries`` the last one fails with
``LockNotAcquiredError``. The lease a run holds names the worker and the result id.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_locks.service import Locks
from tests.waiting import eventually

pytestmark = [
    pytest.mark.tasks,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]

RETRIES_KWARG = "_django_locks_retries"


@pytest.fixture
def workers(tmp_path: Path, postgres_server: Any) -> Iterator[Any]:
    from tests.tasks_app.processes import Workers

    group = Workers(tmp_path)
    yield group
    # Printed during teardown: pytest shows it only for a failed test.
    print(group.destroy())


@pytest.fixture
def tasks() -> Any:
    from tests.tasks_app import tasks

    return tasks


@pytest.fixture
def store_locks() -> Iterator[Locks]:
    """A service of the test process on the workers' store (the database store on postgres)."""
    from django_locks.stores.database import DatabaseStore

    service = Locks(DatabaseStore("postgres"), ttl="2s")
    yield service
    service.store.close()


def results_of(task: Any) -> list[Any]:
    """The rows of django-tasks-db for ``task``, oldest first."""
    from django_tasks_db.models import DBTaskResult  # type: ignore[import-not-found,unused-ignore]

    rows = DBTaskResult.objects.filter(task_path=task.module_path)
    return sorted(rows, key=lambda row: row.enqueued_at)


def wait_finished(results: list[Any], timeout: float = 60) -> None:
    def finished() -> bool:
        for result in results:
            result.refresh()
        return all(result.is_finished for result in results)

    eventually(finished, timeout=timeout, every=0.1, what=lambda: f"unfinished: {results}")


def intervals(runs: list[dict[str, Any]]) -> list[tuple[float, float, int, str]]:
    """``(start, end, pid, result)`` of each complete run."""
    starts = {run["result"]: run for run in runs if run["event"] == "start"}
    return sorted(
        (starts[run["result"]]["at"], run["at"], run["pid"], run["result"])
        for run in runs
        if run["event"] == "end"
    )


def most_at_once(spans: list[tuple[float, float, int, str]]) -> int:
    events = sorted([(start, 1) for start, *_ in spans] + [(end, -1) for _, end, *_ in spans])
    current = peak = 0
    for _, step in events:  # an end sorts before a start at the same instant
        current += step
        peak = max(peak, current)
    return peak


def start_workers(workers: Any, count: int) -> None:
    for n in range(count):
        workers.start(f"worker-{n}")


def test_runs_of_one_key_never_overlap_across_workers(workers: Any, tasks: Any) -> None:
    results = [tasks.waiting.enqueue(n, 0.3) for n in range(8)]
    start_workers(workers, 3)
    wait_finished(results)
    assert {result.status for result in results} == {"SUCCESSFUL"}, results
    spans = intervals(workers.runs("waiting"))
    assert sorted(result for *_, result in spans) == sorted(result.id for result in results)
    assert most_at_once(spans) == 1, spans
    for (_, end, *_), (start, *_) in itertools.pairwise(spans):
        assert end <= start, spans
    assert len({pid for _, _, pid, _ in spans}) >= 2, "one worker took every run"
    assert {pid for _, _, pid, _ in spans} <= workers.pids()


def test_a_run_that_finds_the_lock_taken_is_skipped(workers: Any, tasks: Any) -> None:
    start_workers(workers, 3)
    results = [tasks.exclusive.enqueue(n, 1.5) for n in range(3)]
    wait_finished(results)
    spans = intervals(workers.runs("exclusive"))
    assert most_at_once(spans) == 1, spans
    ran = {result for *_, result in spans}
    returned = {result.id: result.return_value for result in results}
    assert ran and len(ran) < 3, "no run was skipped: the workers did not race"
    for result_id, value in returned.items():
        assert (value is None) == (result_id not in ran), returned


def test_limit_concurrency_holds_across_workers(workers: Any, tasks: Any) -> None:
    results = [tasks.limited.enqueue(n, 0.6) for n in range(8)]
    start_workers(workers, 4)
    wait_finished(results)
    assert {result.status for result in results} == {"SUCCESSFUL"}, results
    spans = intervals(workers.runs("limited"))
    assert len(spans) == 8
    assert most_at_once(spans) == 2, spans  # never 3, and both permits were used
    permits = {run["permit"] for run in workers.runs("limited") if run["event"] == "start"}
    assert permits == {1, 2}


def test_the_lease_of_a_run_names_the_worker_and_the_result(workers: Any, tasks: Any) -> None:
    from django_locks.models import Lease

    start_workers(workers, 1)
    result = tasks.exclusive.enqueue(0, 2.0)

    def lease() -> Any:
        return (
            Lease.objects.using("postgres")
            .filter(key="tasks-test:exclusive", released_at__isnull=True)
            .first()
        )

    eventually(lambda: lease() is not None, timeout=30, what="no lease while the task runs")
    row = lease()
    result.refresh()
    assert result.status == "RUNNING"
    assert (row.holder_kind, row.holder_detail) == ("task", result.id)
    assert int(row.holder.rsplit(":", 1)[1]) in workers.pids()
    wait_finished([result])
    assert result.return_value == 0


def retry_chain(task: Any, name: str) -> list[Any]:
    """The results of ``task`` called with ``name``: the enqueued one and its retries."""
    return [row for row in results_of(task) if row.args_kwargs["args"][:1] == [name]]


def test_retry_enqueues_again_with_run_after_and_fails_past_max_retries(
    workers: Any, tasks: Any, store_locks: Locks
) -> None:
    from django_locks.exceptions import LockNotAcquiredError

    name = uuid.uuid4().hex[:8]
    held = store_locks.acquire(f"tasks-test:retried:{name}")
    assert held is not None
    start_workers(workers, 2)
    try:
        tasks.retried.enqueue(name, 0.1)

        def failed() -> bool:
            rows = retry_chain(tasks.retried, name)
            return len(rows) == 3 and rows[-1].status == "FAILED"

        eventually(failed, timeout=60, what=lambda: str(retry_chain(tasks.retried, name)))
        time.sleep(1.5)  # nothing comes after the last one
    finally:
        held.release()
    rows = retry_chain(tasks.retried, name)
    assert len(rows) == 3, rows  # the first run and max_retries=2 retries
    assert [row.args_kwargs["kwargs"].get(RETRIES_KWARG) for row in rows] == [None, 1, 2]
    assert [row.status for row in rows] == ["SUCCESSFUL", "SUCCESSFUL", "FAILED"]
    assert [row.return_value for row in rows[:2]] == [None, None]
    for before, after in itertools.pairwise(rows):
        assert after.enqueued_at >= before.started_at  # enqueued by the run before it
        assert after.run_after > after.enqueued_at  # deferred, not due at once
        assert after.started_at >= after.run_after
    last = rows[-1]
    path = f"{LockNotAcquiredError.__module__}.{LockNotAcquiredError.__qualname__}"
    assert last.exception_class_path == path
    assert f"tasks-test:retried:{name}" in last.traceback
    assert workers.runs("retried") == []  # the function never ran


def test_a_retry_runs_once_the_lock_is_free(workers: Any, tasks: Any, store_locks: Locks) -> None:
    name = uuid.uuid4().hex[:8]
    held = store_locks.acquire(f"tasks-test:patient:{name}")
    assert held is not None
    start_workers(workers, 2)
    try:
        tasks.patient.enqueue(name, 0.1)
        eventually(
            lambda: len(retry_chain(tasks.patient, name)) >= 2,
            timeout=60,
            what="no retry was enqueued",
        )
    finally:
        held.release()

    def succeeded() -> bool:
        return any(row.status == "SUCCESSFUL" and row.return_value == name for row in rows())

    def rows() -> list[Any]:
        return retry_chain(tasks.patient, name)

    eventually(succeeded, timeout=60, what=lambda: str(rows()))
    chain = rows()
    assert chain[-1].return_value == name and chain[-1].status == "SUCCESSFUL"
    assert all(row.status == "SUCCESSFUL" and row.return_value is None for row in chain[:-1])
    assert len([run for run in workers.runs("patient") if run["event"] == "end"]) == 1


def test_on_one_instance_under_task_fails_on_a_worker(workers: Any) -> None:
    from django_locks.contrib.tasks_checks import ON_ONE_INSTANCE, check_tasks
    from tests.tasks_app import once

    assert (ON_ONE_INSTANCE, "tests.tasks_app.once.nightly") in {
        (message.id, message.obj) for message in check_tasks()
    }
    start_workers(workers, 1)
    result = once.nightly.enqueue()
    wait_finished([result])
    assert result.status == "FAILED"
    [row] = results_of(once.nightly)
    assert row.exception_class_path == "django.core.exceptions.ImproperlyConfigured"
    assert "run_leader --exec" in row.traceback
