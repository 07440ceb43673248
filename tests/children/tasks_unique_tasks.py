"""The django.tasks functions of the enqueue-time uniqueness tests (tests/test_tasks_unique*.py):
each run appends two JSON lines, ``start`` and ``stop`` (the instant, the pid, whether it held a
lock), to the file in DJANGO_LOCKS_TEST_RUNS, or to :data:`RUNS` in this process without it."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

import json
import os
import time
from typing import Any

from django_locks.context import current_lock
from django_locks.contrib.tasks import unique_task
from tests.children import env as _child
from tests.tasks_app.compat import task

RUNS: list[dict[str, Any]] = []


def _record(run: dict[str, Any]) -> None:
    path = _child.read("RUNS")
    if not path:
        RUNS.append(run)
        return
    with open(path, "a") as runs:
        runs.write(json.dumps(run) + "\n")
        runs.flush()
        os.fsync(runs.fileno())


def _run(name: str, pause: float) -> None:
    from django_locks.contrib.tasks import current_task_result

    result = current_task_result()
    base = {
        "task": "unique",
        "name": name,
        "result": str(result.id) if result is not None else None,
        "pid": os.getpid(),
        "locked": current_lock() is not None,
    }
    _record({**base, "event": "start", "at": time.time()})
    time.sleep(pause)
    _record({**base, "event": "stop", "at": time.time()})


@task()
@unique_task
def sleep_for(name: str, pause: float = 0.0) -> str:
    """Run for ``pause`` seconds; record its start and stop, and whether it held a lock."""
    _run(name, pause)
    return name


@task()
@unique_task(key="report:{customer_id}", until="started", ttl="1h")
def report(customer_id: int, pause: float = 0.0, **extra: Any) -> int:
    """A task with unique_task defaults: the key template, until="started" and a ttl."""
    _run(f"report:{customer_id}", pause)
    return customer_id


@task()
@unique_task
async def sleep_async(name: str, pause: float = 0.0) -> str:
    """An async task function: the same records."""
    _run(name, pause)
    return name


@task(takes_context=True)
@unique_task(ttl="1h")
def with_context(context: Any, name: str) -> str:
    """A task taking the context: the key is of its other arguments."""
    _run(name, 0.0)
    return str(context.task_result.id)


@task()
def plain(n: int) -> int:
    """A task without @unique_task: enqueue_unique refuses it."""
    return n
