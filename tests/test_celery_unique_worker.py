"""Celery's enqueue-time uniqueness for real: enqueuing processes, a Redis broker, prefork workers,
the lock store shared by all (RedisStore, or the DatabaseStore on the processes' SQLite file).

The tasks are in tests/celeryapp/unique_tasks.py; the enqueuers are tests/celeryapp/enqueue.py
processes (Django set up with the workers' settings), which say which calls were accepted (their
task ids) and which refused. The broker's queue is the Redis list ``celery`` of database 1. The
figures are printed (``pytest -s``).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

from tests import test_celery
from tests.celeryapp.processes import ROOT, Processes
from tests.test_celery import database_locks, redis_locks
from tests.waiting import eventually

template_db = test_celery.template_db
cluster = test_celery.cluster

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.celery, pytest.mark.timeout(240)]

wait_for = functools.partial(eventually, every=0.05)


def enqueue(
    processes: Processes,
    task: str,
    args: list[Any] | None,
    *,
    kwargs: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    procs: int = 1,
    threads: int = 1,
    delay: float = 0.0,
    sequence: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run ``procs`` enqueuing processes of ``threads`` threads each, every thread calling
    ``task.apply_async(args, kwargs, **options)`` at one instant; or one process making the
    calls of ``sequence`` in turn (each ``{"args":..., "options":..., "after": seconds}``);
    return every outcome."""
    start_at = time.time() + delay
    call = json.dumps(sequence or {"args": args, "kwargs": kwargs or {}, "options": options or {}})
    outs, children = [], []
    for _ in range(procs):
        out = str(processes.tmp / f"enqueue-{uuid.uuid4().hex[:8]}.json")
        command = [sys.executable, "-m", "tests.celeryapp.enqueue", task, call, str(threads)]
        children.append(
            subprocess.Popen(
                [*command, str(start_at), out],
                env=processes.env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
        outs.append(out)
    results: list[dict[str, Any]] = []
    for child, out in zip(children, outs, strict=True):
        output, _ = child.communicate(timeout=120)
        assert child.returncode == 0, output.decode(errors="replace")
        with open(out, encoding="utf-8") as fh:
            results.extend(json.load(fh))
    return results


def accepted(results: list[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in results if "id" in r]


def queue_length(redis_server: Any) -> int:
    with redis_server.client() as client:
        client.execute_command("SELECT", 1)
        return int(client.llen("celery"))


def broker_client(redis_server: Any) -> Any:
    import redis

    return redis.Redis.from_url(redis_server.url.rsplit("/", 1)[0] + "/1")


def log_lines(processes: Processes, worker: str, pattern: str) -> list[str]:
    return [line for line in processes.log(worker).splitlines() if re.search(pattern, line)]


@pytest.mark.parametrize("store", ["redis", "database"])
def test_a_hundred_concurrent_enqueues_from_four_processes_queue_one_message(
    cluster: Any, redis_server: Any, store: str
) -> None:
    settings = redis_locks(redis_server) if store == "redis" else database_locks()
    processes = cluster(locks=settings)
    results = enqueue(processes, "unique_default", [7], procs=4, threads=25, delay=4.0)
    ids = accepted(results)
    with broker_client(redis_server) as broker:
        queued = broker.llen("celery")
    spread = max(r["at"] for r in results) - min(r["at"] for r in results)
    print(
        f"\n{store}: 100 enqueues from 4 processes within {spread:.3f}s: {len(ids)} accepted, "
        f"{len(results) - len(ids)} refused, {queued} message(s) in the queue"
    )
    assert len(results) == 100
    assert len(ids) == 1 and queued == 1
    refusals = {r["refused"] for r in results if "refused" in r}
    assert all(ids[0][:30] in holder for holder in refusals), refusals  # naming the message
    processes.worker("w1")
    wait_for(lambda: processes.runs("unique_default-end"), timeout=60, what="the run")
    time.sleep(1.0)
    assert [run["id"] for run in processes.runs("unique_default-start")] == ids
    # Finished: the key is free again; one more enqueue is accepted, and runs.
    assert len(accepted(enqueue(processes, "unique_default", [7]))) == 1


@pytest.mark.parametrize("how", ["worker-not-started", "countdown"])
def test_a_message_queued_past_its_ttl_never_runs_next_to_a_fresh_duplicate(
    cluster: Any, redis_server: Any, how: str
) -> None:
    """unique_lapsing's enqueue-time lease is 1 s. The first message waits longer (no worker
    yet, or a 3 s countdown); a second enqueue is then accepted. Whichever run starts second
    finds the other's lease: it is skipped, logged naming both task ids."""
    processes = cluster(locks=redis_locks(redis_server))
    name = uuid.uuid4().hex[:8]
    if how == "countdown":
        processes.worker("w1", concurrency=2)
        wait_for(lambda: "ready." in processes.log("w1"), timeout=60, what="the worker")
    options = {"countdown": 3} if how == "countdown" else {}
    calls = [
        {"args": [name, 2.5], "options": options, "after": 0},
        {"args": [name, 2.5], "after": 0.2},  # refused: the first message holds the key
        {"args": [name, 2.5], "after": 1.6},  # accepted: the first message's lease lapsed
    ]
    results = enqueue(processes, "unique_lapsing", None, sequence=calls, delay=2.0)
    assert ["id" in r for r in results] == [True, False, True], results
    first, second = accepted(results)
    if how == "worker-not-started":
        assert queue_length(redis_server) == 2
        processes.worker("w1", concurrency=2)
    skipped = rf"Skipped unique_lapsing \(message ({first}|{second}); its enqueue-time lease"
    wait_for(lambda: log_lines(processes, "w1", skipped), timeout=60, what="the duplicate")
    wait_for(lambda: processes.runs("unique_lapsing-end"), timeout=30, what="the run")
    time.sleep(1.0)
    starts = processes.runs("unique_lapsing-start")
    (line,) = log_lines(processes, "w1", skipped)
    ran = starts[0]["id"]
    duplicate = first if ran == second else second
    print(f"\n{how}: ran {ran}, skipped {duplicate}: {line.strip()}")
    assert len(starts) == 1, starts
    assert (
        "WARNING" in line
        and f"message {duplicate};" in line
        and f"message {ran}, queued or running, holds the key" in line
    )
    if how == "countdown":
        assert ran == second  # the fresh message ran; the late one found it running
    assert "run_skipped" not in line or "duplicate" in line


def test_until_finished_refuses_while_running_until_started_accepts(
    cluster: Any, redis_server: Any
) -> None:
    processes = cluster(locks=redis_locks(redis_server))
    processes.worker("w1", concurrency=3)
    name = uuid.uuid4().hex[:8]
    for task in ("unique_finished", "unique_started"):

        def ended(n: int, task: str = task) -> bool:
            return len(processes.runs(f"{task}-end")) >= n

        def started(task: str = task) -> bool:
            return bool(processes.runs(f"{task}-start"))

        (first,) = accepted(enqueue(processes, task, [name, 3]))
        wait_for(started, timeout=60, what=f"{task} runs")
        again = enqueue(processes, task, [name, 0])
        if task == "unique_finished":
            assert accepted(again) == [], "refused while running"
            assert first[:30] in again[0]["refused"]
            wait_for(lambda: ended(1), timeout=30, what="the end")
            assert len(accepted(enqueue(processes, task, [name, 0]))) == 1
            wait_for(lambda: ended(2), timeout=30, what="both ended")
        else:
            assert len(accepted(again)) == 1, "accepted once the first run started"
            wait_for(lambda: ended(2), timeout=30, what="both ended")
            # Runs under "started" may overlap: the key covered the queued messages only.
            assert processes.runs(f"{task}-start")[1]["at"] < processes.runs(f"{task}-end")[0]["at"]
    # run_lock: the run holds the key under "finished" (current_lock()), nothing under "started".
    assert {r["run_lock"] for r in processes.runs("unique_finished-start")} == {f"finished:{name}"}
    assert {r["run_lock"] for r in processes.runs("unique_started-start")} == {None}


def test_send_task_by_name_bypasses_uniqueness(cluster: Any, redis_server: Any) -> None:
    from celery import Celery

    processes = cluster(locks=redis_locks(redis_server))
    processes.worker("w1", concurrency=2)
    name = uuid.uuid4().hex[:8]
    accepted(enqueue(processes, "unique_finished", [name, 3]))
    wait_for(lambda: processes.runs("unique_finished-start"), timeout=60, what="the first run")
    Celery(broker=processes.broker).send_task("unique_finished", args=[name, 0])
    wait_for(lambda: len(processes.runs("unique_finished-end")) == 2, timeout=30, what="both ran")
    second = processes.runs("unique_finished-start")[1]
    assert second["run_lock"] is None  # no header: not unique, run as is


def test_a_retry_keeps_the_key_until_the_retried_run_ends(cluster: Any, redis_server: Any) -> None:
    processes = cluster(locks=redis_locks(redis_server))
    processes.worker("w1", concurrency=2)
    name = uuid.uuid4().hex[:8]
    (first,) = accepted(enqueue(processes, "unique_retrying", [name, 4]))
    retried = r"unique_retrying\[.*\] retry: Retry in 4"
    wait_for(lambda: log_lines(processes, "w1", retried), timeout=60, what="the retry")
    waiting = enqueue(processes, "unique_retrying", [name, 0])  # the retry is queued
    assert accepted(waiting) == [] and first[:30] in waiting[0]["refused"]
    wait_for(lambda: len(processes.runs("unique_retrying-start")) == 2, timeout=30, what="rerun")
    starts = processes.runs("unique_retrying-start")
    assert [r["id"] for r in starts] == [first, first] and [r["retries"] for r in starts] == [0, 1]
    assert {r["run_lock"] for r in starts} == {f"retrying:{name}"}
    assert "Skipped unique_retrying" not in processes.log("w1")
    wait_for(lambda: len(processes.runs("unique_retrying-end")) == 2, timeout=30, what="ended")
    time.sleep(0.5)
    assert len(accepted(enqueue(processes, "unique_retrying", [name, 0]))) == 1  # freed


def test_an_enqueue_adds_one_store_round_trip(redis_server: Any, settings: Any) -> None:
    """Counted by the store's Redis itself (MONITOR, database 0: the store; the broker uses
    database 1; the commands a script runs left out): one command per unique enqueue, none
    for a plain one."""
    import redis
    from celery import Celery

    from django_locks.contrib.celery import unique
    from django_locks.testing import reset_locks

    prefix = f"rt{uuid.uuid4().hex[:6]}"
    settings.LOCKS = {
        "BACKEND": "django_locks.stores.RedisStore",
        "OPTIONS": {"url": redis_server.url, "prefix": prefix},
    }
    app = Celery("roundtrips", broker=redis_server.url.rsplit("/", 1)[0] + "/1")
    app.conf.task_ignore_result = True

    def body(n: int) -> None:
        """Never run here."""

    plain = app.task(shared=False, name="rt_plain")(body)
    counted = unique(ttl="1m")(app.task(shared=False, name="rt_unique")(body))
    app.finalize()
    counted.delay(-1)  # warm up: the connections, the store's scripts
    plain.delay(-1)
    commands: list[tuple[int, str]] = []
    monitor_ready = threading.Event()
    stop = threading.Event()

    def watch() -> None:
        with redis.Redis.from_url(redis_server.url).monitor() as monitor:
            monitor_ready.set()
            for command in monitor.listen():
                if "rt-stop" in command["command"]:
                    break
                if not stop.is_set() and command.get("client_type") != "lua":
                    commands.append((int(command["db"]), command["command"]))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    monitor_ready.wait(10)
    time.sleep(0.2)
    counts = {}
    for task in (plain, counted):
        commands.clear()
        for n in range(10):
            task.delay(n)
        time.sleep(0.3)
        counts[task.name] = [c for db, c in commands if db == 0 and "rt-stop" not in c]
    stop.set()
    with redis.Redis.from_url(redis_server.url) as client:
        client.get("rt-stop")
    watcher.join(10)
    print(
        f"\nstore commands for 10 enqueues: plain {len(counts['rt_plain'])}, unique "
        f"{len(counts['rt_unique'])} ({counts['rt_unique'][:1]})"
    )
    assert counts["rt_plain"] == []
    assert len(counts["rt_unique"]) == 10, counts["rt_unique"]
    reset_locks()
