"""The Dramatiq guide (docs/howto/dramatiq.rst), run as printed: its actors in two real
``dramatiq`` worker processes of two threads each on a RedisBroker, the Redis lock store on the
same server.

Messages for one account sent at once never run two at once: with the default ``"skip"`` those
finding a sync running are done without running; with ``on_conflict="raise"`` turned into
``dramatiq.Retry`` Dramatiq's Retries middleware runs each of them later, one at a time, and the
workers log no error; without the decorator they run side by side.
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

pytestmark = [pytest.mark.slow, pytest.mark.redis]

WORKER = "tests.guides.dramatiq_worker"


@pytest.fixture
def children(tmp_path: Path, redis_server: Any) -> Iterator[Children]:
    with redis_server.client() as client:
        for key in client.scan_iter("dramatiq:*"):  # a previous test's queues
            client.delete(key)
    group = Children(
        tmp_path,
        broker=redis_server.url,
        locks={
            "BACKEND": "django_locks.stores.RedisStore",
            "OPTIONS": {"url": redis_server.url, "prefix": f"dq{uuid.uuid4().hex[:6]}"},
            "TTL": "2s",
        },
    )
    for name in ("worker-1", "worker-2"):
        group.start(name, ["-m", "dramatiq", WORKER, "--processes", "1", "--threads", "2"])
    time.sleep(2.0)  # both workers consuming
    yield group
    print(group.destroy())  # shown by pytest for a failed test only


def send(children: Children, actor: str, count: int) -> None:
    children.run(["-m", WORKER, "send", actor, str(count)])


def test_messages_for_one_account_never_run_two_at_once(children: Children) -> None:
    send(children, "skip", 8)
    time.sleep(2.0)
    runs = spans(children.runs())
    assert most_at_once(runs) == 1, runs
    assert 1 <= len(runs) < 8, runs  # those that found a sync running were skipped


def test_on_conflict_raise_is_retried_by_dramatiq_one_at_a_time(children: Children) -> None:
    send(children, "raise", 4)
    eventually(lambda: len(spans(children.runs())) == 4, timeout=15, every=0.1)
    runs = spans(children.runs())
    assert most_at_once(runs) == 1, runs
    started = {run["pid"] for run in children.runs("start")}
    logs = "".join(path.read_text() for path in children.tmp.glob("worker-*.log"))
    assert "Retrying message" in logs and "unhandled exception" not in logs, logs
    print(f"4 runs one at a time in {runs[-1][1] - runs[0][0]:.1f}s, by {len(started)} pids")


def test_without_the_decorator_the_workers_run_them_at_once(children: Children) -> None:
    send(children, "undecorated", 8)
    eventually(lambda: len(spans(children.runs())) == 8, timeout=10, every=0.1)
    # Two at once is enough to show the overlap the decorator prevents; more needs both workers
    # to have fetched messages, and one worker's prefetch may take all eight (a CI run saw that).
    assert most_at_once(spans(children.runs())) >= 2
