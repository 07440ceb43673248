"""django.tasks tasks on the ImmediateBackend (no worker: a run happens inside enqueue()), for
the fast tests; the E003 / W003 findings of django_locks' checks live here, away from the tasks
the db_worker processes import (a worker runs the checks when it starts)."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

from typing import Any

from django_locks import current_lock, on_one_instance, without_overlapping
from django_locks.contrib.tasks import current_task_result
from tests.tasks_app.compat import task

SEEN: list[dict[str, Any]] = []


@task(backend="immediate")
@without_overlapping("tasks-immediate:plain")
def plain(n: int) -> int:
    """Records what the run saw: its result, its run lock and the lock's holder."""
    from django_locks.holders import this_process

    lock = current_lock()
    SEEN.append(
        {
            "result": current_task_result(),
            "run_lock": lock.key if lock is not None else None,
            "holder": this_process(),
        }
    )
    return n


@task(backend="immediate")
@without_overlapping("tasks-immediate:retry", on_conflict="retry")
def retry_without_defer() -> None:
    """on_conflict='retry' on a backend that cannot defer (W003; refused at a conflict)."""


@task(backend="immediate")
@on_one_instance("tasks-immediate:once")
def once() -> None:
    """on_one_instance under @task() (E003; every run refused)."""


@task(backend="immediate")
def undecorated() -> None:
    """A task without django_locks' decorators: nothing is found, nothing changes."""
