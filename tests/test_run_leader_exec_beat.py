"""``celery beat`` made highly available by ``run_leader --exec``: three instances, one beat
publishing to a real worker; a SIGKILL of the leading ``run_leader`` hands the schedule to
another instance's beat, and the beats never publish in turns (one beat at a time)."""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.celeryapp.processes import Processes, celery_cmd, migrate
from tests.helpers import eventually

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.celery, pytest.mark.timeout(180)]

KEY = "beat:exec"


@pytest.fixture
def processes(tmp_path: Path, redis_server: Any) -> Iterator[Processes]:
    template = tmp_path / "template.sqlite3"
    migrate(template)
    with redis_server.client() as client:
        client.flushall()
    broker = redis_server.url.rsplit("/", 1)[0] + "/1"
    locks = {
        "BACKEND": "django_locks.stores.RedisStore",
        "OPTIONS": {"url": redis_server.url, "prefix": f"exec{os.getpid()}"},
    }
    schedule = {"plain": {"task": "tests.celeryapp.tasks.plain", "every": 1}}
    directory = tmp_path / "p"
    directory.mkdir()
    made = Processes(directory, template, broker, locks=locks, schedule=schedule)
    yield made
    print(made.destroy())


def leading(processes: Processes) -> list[int]:
    """The instances whose log says they lead, in the order they last started leading."""
    found = []
    for instance in range(3):
        log = processes.log(f"run_leader-{instance}")
        if "Leading beat:exec" in log:
            found.append((log.rfind("Leading beat:exec"), instance))
    return [instance for _, instance in sorted(found)]


def test_celery_beat_as_the_command_fails_over(processes: Processes) -> None:
    processes.worker("worker")
    for instance in range(3):
        beat = [*celery_cmd(), "beat", "-l", "INFO", "--max-interval", "1"]
        beat += ["-s", str(processes.tmp / f"schedule-{instance}")]
        beat += ["--pidfile", str(processes.tmp / f"beat-{instance}.pid")]
        args = [sys.executable, "-m", "django", "run_leader", "--exec", KEY]
        processes.spawn(f"run_leader-{instance}", [*args, "--ttl", "3s", "--", *beat])
    eventually(lambda: len(processes.runs("plain")) >= 4, timeout=60, what="the beat publishes")
    first = leading(processes)
    assert len(first) == 1, first
    killed = time.time()
    os.kill(processes.process(f"run_leader-{first[0]}").pid, signal.SIGKILL)
    eventually(lambda: len(leading(processes)) == 2, timeout=20, what="another instance leads")
    eventually(
        lambda: len([r for r in processes.runs("plain") if r["at"] > killed + 1]) >= 6,
        timeout=30,
        what="the next beat publishes",
    )
    runs = processes.runs("plain")
    beats = [run["beat"] for run in runs]
    print("publishing beats in turn:", [k for k, _ in itertools.groupby(beats)])
    print(
        "no tick from",
        f"{max(r['at'] for r in runs if r['beat'] == beats[0]) - killed:.3f}s",
        f"to {min(r['at'] for r in runs if r['beat'] != beats[0]) - killed:.3f}s after the kill",
    )
    assert all(beats), "the beat headers are missing"
    # One beat, then the other: never back to the first (it was stopped by its supervisor).
    assert len([k for k, _ in itertools.groupby(beats)]) == 2, beats
    # One publication per tick (every second) from each beat.
    for beat in set(beats):
        ats = sorted(r["at"] for r in runs if r["beat"] == beat)
        close = [b - a for a, b in itertools.pairwise(ats) if b - a < 0.5]
        assert not close, (beat, close)
