"""django.tasks tasks run by the db_worker tests; each run appends JSON lines to the file of
tests/children/env.py's RUNS: ``start`` and ``end`` with the instants, the pid and the result id."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

import json
import os
import time
from typing import Any

from django_locks import current_lock, limit_concurrency, without_overlapping
from django_locks.contrib.tasks import current_task_result
from tests.children import env as _child
from tests.tasks_app.compat import task


def record(name: str, event: str, **extra: Any) -> None:
    result = current_task_result()
    lock = current_lock()
    line = {
        "task": name,
        "event": event,
        "pid": os.getpid(),
        "at": time.time(),
        "result": getattr(result, "id", None),
        "run_lock": lock.key if lock is not None else None,
        "permit": lock.permit if lock is not None else None,
        **extra,
    }
    with open(_child.read("RUNS"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def _run(name: str, n: int, seconds: float) -> int:
    record(name, "start", n=n)
    time.sleep(seconds)
    record(name, "end", n=n)
    return n


@task()
@without_overlapping("tasks-test:exclusive", ttl="2s")
def exclusive(n: int, seconds: float) -> int:
    """One run at a time across every worker; a run that finds it taken is skipped."""
    return _run("exclusive", n, seconds)


@task()
@without_overlapping("tasks-test:waiting", ttl="2s", wait="30s")
def waiting(n: int, seconds: float) -> int:
    """One run at a time across every worker; a run waits for its turn."""
    return _run("waiting", n, seconds)


@task()
@limit_concurrency("tasks-test:limited", permits=2, ttl="2s", wait="30s")
def limited(n: int, seconds: float) -> int:
    """At most two runs at once across every worker."""
    return _run("limited", n, seconds)


@task()
@without_overlapping("tasks-test:retried:{name}", ttl="600ms", on_conflict="retry", max_retries=2)
def retried(name: str, seconds: float) -> str:
    """Enqueued again (run_after) while the run lock is taken, at most twice."""
    _run("retried", 0, seconds)
    return name


@task()
@without_overlapping("tasks-test:patient:{name}", ttl="600ms", on_conflict="retry", max_retries=6)
def patient(name: str, seconds: float) -> str:
    """As ``retried``, with room for the lock to be freed between retries."""
    _run("patient", 0, seconds)
    return name
