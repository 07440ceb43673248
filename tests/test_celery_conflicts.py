"""``on_conflict`` on Celery tasks, for real: prefork workers, a Redis broker, a shared store.

The tasks (tests/celeryapp/tasks.py) record their runs' starts and ends; "another instance" is a
run of the same task on a worker, or this test process holding the key in the same store.
Celery says in the worker's log what became of a run (``retry: Retry in ...``, ``raised
unexpected: ...``).
"""

from __future__ import annotations

import functools
import os
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from django_locks import Locks
from tests import test_celery
from tests.test_celery import database_locks, redis_locks
from tests.waiting import eventually

# The fixtures of the Celery tests: a template database, the processes torn down after each test.
template_db = test_celery.template_db
cluster = test_celery.cluster

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(180)]

wait_for = functools.partial(eventually, every=0.05)
TASKS = "tests.celeryapp.tasks"


@pytest.fixture
def other(redis_server: Any) -> Iterator[Locks]:
    """This process as another instance, on the store the workers of ``redis_locks`` use."""
    from django_locks.stores import RedisStore

    options = redis_locks(redis_server)["OPTIONS"]
    service = Locks(RedisStore(**options), ttl="30s")
    yield service
    service.store.close()


def client_for(processes: Any) -> Any:
    from celery import Celery

    return Celery(broker=processes.broker)


def log_lines(processes: Any, worker: str, pattern: str) -> list[str]:
    return [line for line in processes.log(worker).splitlines() if re.search(pattern, line)]


def test_raise_fails_the_task_naming_the_holder(
    cluster: Any, redis_server: Any, other: Locks
) -> None:
    processes = cluster(locks=redis_locks(redis_server))
    processes.worker("w1")
    client = client_for(processes)
    name = uuid.uuid4().hex[:8]
    held = other.acquire(f"raising:{name}")
    assert held is not None
    client.send_task(f"{TASKS}.raising", args=[name, 0])
    failed = rf"{TASKS}\.raising\[.*\] raised unexpected: LockNotAcquiredError"
    wait_for(lambda: log_lines(processes, "w1", failed), timeout=60, what="the task failed")
    (line,) = log_lines(processes, "w1", failed)
    assert f"Lock 'raising:{name}' is held by " in line and f" pid {os.getpid()}" in line, line
    assert processes.runs("raising-start") == []
    held.release()
    client.send_task(f"{TASKS}.raising", args=[name, 0])
    wait_for(lambda: processes.runs("raising-end"), timeout=30, what="the next run ran")


def test_retry_runs_the_task_again_later_until_its_key_is_free(
    cluster: Any, redis_server: Any, other: Locks
) -> None:
    processes = cluster(locks=redis_locks(redis_server))
    processes.worker("w1")
    client = client_for(processes)
    name = uuid.uuid4().hex[:8]
    held = other.acquire(f"retrying:{name}")
    assert held is not None
    client.send_task(f"{TASKS}.retrying", args=[name, 0])
    retried = rf"{TASKS}\.retrying\[.*\] retry: Retry in "
    wait_for(lambda: log_lines(processes, "w1", retried), timeout=60, what="a retry")
    released_at = time.time()
    held.release()
    wait_for(lambda: processes.runs("retrying-end"), timeout=30, what="a retry ran")
    (run,) = processes.runs("retrying-start")
    assert run["at"] >= released_at
    # Each retry is a new run of the task: Celery counts them, and said each one.
    assert run["retries"] >= 1
    assert len(log_lines(processes, "w1", retried)) == run["retries"]
    assert "LockNotAcquiredError" in log_lines(processes, "w1", retried)[0]


def test_retry_gives_up_after_max_retries_with_lock_not_acquired(
    cluster: Any, redis_server: Any, other: Locks
) -> None:
    processes = cluster(locks=redis_locks(redis_server))
    processes.worker("w1")
    client = client_for(processes)
    name = uuid.uuid4().hex[:8]
    held = other.acquire(f"impatient:{name}")
    assert held is not None
    client.send_task(f"{TASKS}.impatient", args=[name, 0])
    failed = rf"{TASKS}\.impatient\[.*\] raised unexpected: LockNotAcquiredError"
    wait_for(lambda: log_lines(processes, "w1", failed), timeout=60, what="the task failed")
    held.release()
    # max_retries=1: one retry, then the failure.
    assert len(log_lines(processes, "w1", rf"{TASKS}\.impatient\[.*\] retry: ")) == 1
    assert f"Lock 'impatient:{name}' is held by" in log_lines(processes, "w1", failed)[0]
    assert processes.runs("impatient-start") == []


@pytest.mark.parametrize("store", ["redis", "database"])
def test_replace_stops_the_running_task_and_runs_after_it(
    cluster: Any, redis_server: Any, store: str
) -> None:
    settings = redis_locks(redis_server) if store == "redis" else database_locks()
    processes = cluster(locks=settings)
    processes.worker("w1", concurrency=2)
    client = client_for(processes)
    name = uuid.uuid4().hex[:8]
    client.send_task(f"{TASKS}.replacing", args=[name, 60])
    wait_for(lambda: processes.runs("replacing-start"), timeout=60, what="the first run")
    client.send_task(f"{TASKS}.replacing", args=[name, 0])
    wait_for(lambda: len(processes.runs("replacing-end")) == 2, timeout=30, what="both ended")
    first, second = processes.runs("replacing-start")
    first_end, second_end = processes.runs("replacing-end")
    assert first_end["how"] == "PreemptedError"  # its signal aborted: it stopped
    assert second_end["how"] == "finished"
    assert second["at"] >= first_end["at"], "the new run began after the old one ended"
    assert second["run_token"] > first["run_token"]
    log = processes.log("w1")
    assert f"Lock preempted: key='replacing:{name}'" in log
    assert f"Lock lost: key='replacing:{name}'" not in log  # no lock_lost: nothing failed


def test_replace_whose_holder_never_stops_is_skipped_not_replaced(
    cluster: Any, redis_server: Any, other: Locks
) -> None:
    processes = cluster(locks=redis_locks(redis_server))
    processes.worker("w1")
    client = client_for(processes)
    name = uuid.uuid4().hex[:8]
    held = other.acquire(f"replacing:{name}", ttl="60s")  # renewed every 20 s: not in time
    assert held is not None
    client.send_task(f"{TASKS}.replacing", args=[name, 0])
    skipped = (
        rf"Skipped {TASKS}\.replacing \(key 'replacing:{name}'\): the running one did not stop "
        r"in time \(held by "
    )
    wait_for(lambda: log_lines(processes, "w1", skipped), timeout=60, what="not replaced")
    assert held.held
    held.release()
    assert processes.runs("replacing-start") == []
    # Skipped, the task succeeded (returning None): nothing failed or was retried.
    assert not log_lines(processes, "w1", rf"{TASKS}\.replacing\[.*\] (raised|retry)")


def test_wait_runs_the_task_once_the_running_one_ends(
    cluster: Any, redis_server: Any, other: Locks
) -> None:
    processes = cluster(locks=redis_locks(redis_server))
    processes.worker("w1")
    client = client_for(processes)
    name = uuid.uuid4().hex[:8]
    held = other.acquire(f"waiting:{name}")
    assert held is not None
    client.send_task(f"{TASKS}.waiting", args=[name, 0])
    received = rf"{TASKS}\.waiting\[.*\] received"
    wait_for(lambda: log_lines(processes, "w1", received), timeout=60, what="the task received")
    time.sleep(1.0)
    assert processes.runs("waiting-start") == []  # waiting for the key
    released_at = time.time()
    held.release()
    wait_for(lambda: processes.runs("waiting-end"), timeout=15, what="the run after the wait")
    assert processes.runs("waiting-start")[0]["at"] >= released_at
    assert "Skipped" not in processes.log("w1")
