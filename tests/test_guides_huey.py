"""The Huey guide (docs/howto/huey.rst), run as printed: its tasks in real ``manage.py run_huey``
consumers (huey.contrib.djhuey, a RedisHuey) racing on one queue, the Redis lock store on the same
server.

The imports of one supplier, enqueued at once and taken by two consumers of two thread workers
each, never run two at once with ``without_overlapping`` (and do without it). The periodic task
is enqueued by every consumer that runs Huey's scheduler: once per tick with one such consumer and
the others started with ``-n``, twice with two. The decorator above ``@task()`` is refused.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.guides.children import Children, most_at_once, spans
from tests.waiting import eventually

CHILD = "tests.guides.huey_child"


@pytest.fixture
def children(tmp_path: Path, redis_server: Any) -> Iterator[Children]:
    with redis_server.client() as client:
        for key in client.scan_iter("huey.*"):  # a previous test's queue and schedule
            client.delete(key)
    group = Children(
        tmp_path,
        settings="tests.guides.huey_settings",
        broker=redis_server.url,
        locks={
            "BACKEND": "django_locks.stores.RedisStore",
            "OPTIONS": {"url": redis_server.url, "prefix": f"huey{uuid.uuid4().hex[:6]}"},
            "TTL": "2s",
        },
    )
    yield group
    print(group.destroy())  # shown by pytest for a failed test only


def start(children: Children, name: str, *options: str) -> None:
    ready = len(children.runs("ready"))
    children.start(name, ["-m", CHILD, "consumer", *options])
    eventually(lambda: len(children.runs("ready")) > ready, timeout=30, what=children.destroy)


def run_imports(children: Children, mode: str, count: int) -> list[tuple[float, float]]:
    start(children, "consumer-1", "-n")
    start(children, "consumer-2", "-n")
    time.sleep(1.0)  # both consumers polling the queue
    children.run(["-m", CHILD, "enqueue", mode, str(count)])
    time.sleep(2.0)  # every message taken (4 workers), each run 0.3 s
    return spans(children.runs())


@pytest.mark.slow
@pytest.mark.redis
def test_imports_of_one_supplier_never_run_two_at_once(children: Children) -> None:
    runs = run_imports(children, "decorated", 8)
    assert most_at_once(runs) == 1, runs
    assert 1 <= len(runs) < 8, runs  # the runs that found one running were skipped
    started = {run["pid"] for run in children.runs("start")}
    assert len(started) >= 1


@pytest.mark.slow
@pytest.mark.redis
def test_without_the_decorator_the_workers_run_them_at_once(children: Children) -> None:
    runs = run_imports(children, "undecorated", 8)
    assert len(runs) == 8, runs
    assert most_at_once(runs) >= 3, runs  # four workers across the two consumers


@pytest.mark.slow
@pytest.mark.redis
def test_every_consumer_with_the_scheduler_enqueues_each_periodic_tick(
    children: Children,
) -> None:
    start(children, "periodic", "-w", "1")  # the one consumer that runs the scheduler
    start(children, "workers", "-n")
    time.sleep(1.0)
    begin = len(children.runs("digest"))
    time.sleep(4.0)
    once = len(children.runs("digest")) - begin
    assert 3 <= once <= 5, once  # once per tick (a tick a second here)

    start(children, "periodic-2", "-w", "1")  # a second scheduler: every tick twice
    time.sleep(1.0)
    begin = len(children.runs("digest"))
    time.sleep(4.0)
    twice = len(children.runs("digest")) - begin
    assert twice >= 7, twice
    print(f"digests in 4 s: {once} with one scheduler, {twice} with two")


def test_the_lock_decorator_above_the_huey_task_is_refused() -> None:
    from huey import MemoryHuey

    from django_locks import without_overlapping

    huey = MemoryHuey("refused", immediate=True)

    def export() -> None: ...

    with pytest.raises(TypeError, match="decorate functions"):
        without_overlapping("export:refused")(huey.task()(export))
