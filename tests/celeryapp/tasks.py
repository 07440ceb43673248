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
        "catch_up": getattr(request, "django_locks_catch_up", None),
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


# Missed ticks (tests/test_celery_missed_ticks.py): owner leases of 2 s, one entry of each kind.


@shared_task(name="catch_up")
@on_one_instance(ttl="2s", catch_up=True)
def catch_up() -> None:
    """Each published tick recorded first; a beat taking over publishes the latest missed one."""
    record("catch_up")


@shared_task(name="no_catch_up")
@on_one_instance(ttl="2s")
def no_catch_up() -> None:
    """Missed ticks reported only."""
    record("no_catch_up")


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


# on_conflict (tests/test_celery_conflicts.py): each run records its start and its end.


def hold(name: str, what: str, seconds: float) -> None:
    """Record ``<what>-start``, hold the run lock ``seconds`` (or until its signal aborts),
    record ``<what>-end`` with how it ended."""
    lock = current_lock()
    assert lock is not None
    record(f"{what}-start", job=name, retries=current_task.request.retries)
    lock.signal.wait(seconds)
    how = type(lock.signal.reason).__name__ if lock.signal.aborted else "finished"
    record(f"{what}-end", job=name, how=how)


@shared_task
@without_overlapping("raising:{name}", on_conflict="raise", ttl="1s")
def raising(name: str, seconds: float) -> None:
    """Fails with LockNotAcquiredError when a run of it (or anyone) holds its key."""
    hold(name, "raising", seconds)


@shared_task
@without_overlapping("retrying:{name}", on_conflict="retry", max_retries=4, ttl="1s")
def retrying(name: str, seconds: float) -> None:
    """Retried later (at most 4 times) while its key is held."""
    hold(name, "retrying", seconds)


@shared_task
@without_overlapping("impatient:{name}", on_conflict="retry", max_retries=1, ttl="1s")
def impatient(name: str, seconds: float) -> None:
    """Retried once, then fails with LockNotAcquiredError."""
    hold(name, "impatient", seconds)


@shared_task
@without_overlapping("replacing:{name}", on_conflict="replace", ttl="1s")
def replacing(name: str, seconds: float) -> None:
    """A new run stops the running one (its signal aborts) and runs after it."""
    hold(name, "replacing", seconds)


@shared_task
@without_overlapping("waiting:{name}", ttl="1s", wait="10s")
def waiting(name: str, seconds: float) -> None:
    """Waits up to 10 s for the running one to end, then runs."""
    hold(name, "waiting", seconds)
