"""Tasks of the Celery tests; each run appends one JSON line to DJANGO_LOCKS_TEST_RUNS."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

import json
import os
import time
from typing import Any

from celery import current_task, shared_task

from django_locks import current_lock, limit_concurrency, on_one_instance, without_overlapping
from tests.children import env as _child


def record(name: str, **extra: Any) -> None:
    request = current_task.request
    lock = current_lock()
    line = {
        "task": name,
        "pid": os.getpid(),
        "at": time.time(),
        "key": getattr(request, "django_locks_key", None),
        "token": getattr(request, "django_locks_token", None),
        "scheduled": getattr(request, "django_locks_scheduled", None),
        "beat": getattr(request, "django_locks_beat", None),
        "run_lock": lock.key if lock is not None else None,
        "run_token": lock.fencing_token if lock is not None else None,
        "permit": lock.permit if lock is not None else None,
        **extra,
    }
    with open(_child.read("RUNS"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


@shared_task(name="tick")
@on_one_instance()
def tick() -> None:
    """Named "tick": its default key is the task name, not module.function."""
    record("tick")


@on_one_instance("tock:{n}")
@shared_task
def tock(n: int) -> None:
    """The decorator above @shared_task, with a key template."""
    record("tock", n=n)


@shared_task
def plain() -> None:
    """Not decorated: published once per tick only in the whole-beat mode."""
    record("plain")


@shared_task
@on_one_instance("slow:job")
@without_overlapping(ttl="2s")
def slow(seconds: float) -> None:
    """Slower than its interval."""
    record("slow-start")
    time.sleep(seconds)
    record("slow-end")


@shared_task(bind=True)
@without_overlapping("fenced:job", ttl="1s")
def fenced(self: Any, product: str, value: int, pause_file: str) -> int:
    """Write ``value`` with the run's token; wait for ``pause_file`` to vanish first, so the test
    can SIGSTOP the process in between."""
    from django_locks.fencing import fenced_update
    from tests.testapp.models import StockCount

    lock = current_lock()
    assert lock is not None
    record("fenced-start", value=value)
    with open(pause_file + ".ready", "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()} {lock.fencing_token}\n")
    deadline = time.monotonic() + 30
    while os.path.exists(pause_file) and time.monotonic() < deadline:
        time.sleep(0.01)
    written = fenced_update(
        StockCount.objects.filter(product=product), lock.fencing_token, count=value
    )
    record("fenced-end", value=value, written=written)
    return written


@shared_task
@limit_concurrency("limited:{tenant}", permits=2, ttl="2s")
def limited(tenant: str, seconds: float) -> None:
    """At most two runs per tenant at once, across every worker."""
    record("limited-start", tenant=tenant)
    time.sleep(seconds)
    record("limited-end", tenant=tenant)
