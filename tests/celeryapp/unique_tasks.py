"""Unique tasks of the Celery tests (tests/test_celery_unique_worker.py): each run records its
start and end (with its task id) in DJANGO_LOCKS_TEST_RUNS, as tests.celeryapp.tasks does."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

import time
from typing import Any

from celery import current_task, shared_task

from django_locks.contrib.celery import UniqueTask, unique
from tests.celeryapp.tasks import record


def hold(what: str, name: str, seconds: float) -> None:
    task_id = current_task.request.id
    record(f"{what}-start", job=name, id=task_id, retries=current_task.request.retries)
    time.sleep(seconds)
    record(f"{what}-end", job=name, id=task_id)


@unique(ttl="30s")
@shared_task(name="unique_default")
def unique_default(n: int, label: str = "x") -> None:
    """The default key (task name and the arguments' hash), the decorator above @shared_task."""
    hold("unique_default", f"{n}:{label}", 0)


@unique("lapsing:{name}", ttl="1s")
@shared_task(name="unique_lapsing")
def unique_lapsing(name: str, seconds: float) -> None:
    """An enqueue-time lease of 1 s: a message queued longer has lost it."""
    hold("unique_lapsing", name, seconds)


@shared_task(
    base=UniqueTask, unique={"key": "finished:{name}", "ttl": "30s"}, name="unique_finished"
)
def unique_finished(name: str, seconds: float) -> None:
    """until="finished" (the default): refused while queued or running."""
    hold("unique_finished", name, seconds)


@shared_task(
    base=UniqueTask,
    unique={"key": "started:{name}", "until": "started", "ttl": "30s"},
    name="unique_started",
    bind=True,
)
def unique_started(self: Any, name: str, seconds: float) -> None:
    """until="started", a bound task: refused only while queued."""
    hold("unique_started", name, seconds)


@shared_task(
    base=UniqueTask,
    unique={"key": "retrying:{name}", "ttl": "30s"},
    name="unique_retrying",
    bind=True,
)
def unique_retrying(self: Any, name: str, countdown: float) -> None:
    """Retried once (``self.retry``, in ``countdown`` seconds), then ends."""
    hold("unique_retrying", name, 0)
    if self.request.retries == 0:
        raise self.retry(countdown=countdown)
