"""Real ``manage.py run_leader`` processes on PostgreSQL and on Redis: one leader at a time,
tokens growing every term, and handover on SIGTERM, SIGKILL and SIGSTOP.

Each process runs the fenced writer of tests/testapp/leaders.py, which logs every write attempt
with ``time.monotonic()`` readings (one clock for every process of this machine) to the
PostgreSQL test database; the checks read that log.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.children.env import child_env
from tests.helpers import eventually
from tests.testapp.leaders import KEY, STUBBORN
from tests.testapp.models import LeaderWrite, StockCount

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(databases=["default", "postgres"], transaction=True),
]


@pytest.fixture(params=["postgres", pytest.param("redis", marks=pytest.mark.redis)])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fleet(store_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Start ``run_leader`` processes on the chosen store; kill what is left at the end."""
    if store_kind == "redis":
        redis_url = request.getfixturevalue("redis_server").url
        locks = {"BACKEND": "django_locks.stores.RedisStore", "OPTIONS": {"url": redis_url}}
    else:
        locks = {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": {"using": "postgres"}}
    settings_dict = connections["postgres"].settings_dict
    alias = {name: settings_dict[name] for name in ("ENGINE", "NAME", "USER", "HOST", "PORT")}
    env: dict[str, Any] = {"postgres": alias, "locks": locks, "leader_database": "postgres"}
    StockCount.objects.using("postgres").get_or_create(product=KEY)
    LeaderWrite.objects.using("postgres").all().delete()
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(
        ttl: str, count: int = 3, log_level: str = "WARNING"
    ) -> list[subprocess.Popen[bytes]]:
        started = []
        for _ in range(count):
            log = tmp_path / f"run_leader-{len(procs)}.log"
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "django",
                    "run_leader",
                    KEY,
                    "--ttl",
                    ttl,
                    "--grace",
                    "3s",
                    "--settings=tests.leader_settings",
                ],
                cwd=ROOT,
                env=child_env(**env, log_level=log_level),
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
            )
            procs.append((proc, log))
            started.append(proc)
        return started

    start.logs = lambda: {p.pid: log.read_text() for p, log in procs}  # type: ignore[attr-defined]
    yield start
    for proc, _ in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(10)
    for proc, log in procs:
        print(f"--- run_leader {proc.pid} ---\n{log.read_text()}")


def accepted_writes() -> list[LeaderWrite]:
    return list(LeaderWrite.objects.using("postgres").filter(accepted=True).order_by("started"))


def current_leader() -> int:
    return accepted_writes()[-1].pid


def writes_by_others_after(pid: int, instant: float) -> list[LeaderWrite]:
    return [w for w in accepted_writes() if w.pid != pid and w.started > instant]


def check_history() -> list[int]:
    """At most one process wrote at any instant, and tokens only grow; return the terms."""
    terms: list[tuple[int, int, float, float]] = []  # token, pid, first start, last end
    for write in accepted_writes():
        if terms and terms[-1][0] == write.fencing_token:
            token, pid, first, _ = terms[-1]
            assert write.pid == pid, f"two processes wrote with token {token}"
            terms[-1] = (token, pid, first, write.ended)
        else:
            assert not terms or write.fencing_token > terms[-1][0], "a token went back"
            terms.append((write.fencing_token, write.pid, write.started, write.ended))
    for before, after in itertools.pairwise(terms):
        assert before[3] <= after[2], f"terms {before} and {after} overlap"
    return [term[0] for term in terms]


def test_three_processes_one_leader_and_sigterm_hands_over_at_once(fleet) -> None:
    fleet("30s")  # followers campaign every 10 s: a quick handover is the release notice
    eventually(lambda: len(accepted_writes()) > 20, timeout=60, what="the leader writes")
    leader = current_leader()
    terminated = time.monotonic()
    os.kill(leader, signal.SIGTERM)
    eventually(lambda: bool(writes_by_others_after(leader, terminated)), timeout=9, what="takeover")
    handover = writes_by_others_after(leader, terminated)[0].started - terminated
    print(f"SIGTERM handover with a 30 s ttl: {handover:.3f}s")
    assert handover < 3.0, f"{handover:.3f}s: the followers waited for their next campaign"
    _, status = os.waitpid(leader, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    eventually(lambda: len(writes_by_others_after(leader, terminated)) > 10, timeout=30)
    terms = check_history()
    assert len(terms) == 2
    logs = fleet.logs()
    assert "Stepped down from tests:fenced-writer (released)" in logs[leader]
    assert sum("Leading tests:fenced-writer" in text for text in logs.values()) == 2
    # Followers say whom they follow (the holder their failed campaign found), and LOGGING's
    # console handler for the django_locks logger (tests/leader_settings.py) does not make any
    # line print twice.
    followers = [pid for pid in logs if pid != leader]
    leading = f"{socket.gethostname()} pid {leader} (run_leader tests:fenced-writer)"
    for pid in followers:
        assert f"Following tests:fenced-writer: {leading} leads" in logs[pid]
    for text in logs.values():
        lines = text.splitlines()
        assert all(a != b for a, b in itertools.pairwise(lines)), text


def test_sigkill_the_leader_another_leads_within_ttl_and_a_third(fleet) -> None:
    ttl = 2.0
    fleet(f"{ttl}s")
    eventually(lambda: len(accepted_writes()) > 10, timeout=60, what="the leader writes")
    leader = current_leader()
    killed = time.monotonic()
    os.kill(leader, signal.SIGKILL)
    eventually(
        lambda: bool(writes_by_others_after(leader, killed)), timeout=ttl * 5, what="takeover"
    )
    takeover = writes_by_others_after(leader, killed)[0].started - killed
    print(f"SIGKILL takeover with a {ttl:g}s ttl: {takeover:.3f}s (bound {ttl * 4 / 3:.2f}s)")
    assert takeover < ttl * 4 / 3 + 1.0  # ttl + ttl/3, with a margin for process scheduling
    assert len(check_history()) == 2


def test_sigstop_past_the_ttl_the_old_leader_learns_it_lost_by_deadline(fleet) -> None:
    ttl = 2.0
    fleet(f"{ttl}s", log_level="NONE")  # no LOGGING: Python's last resort prints warnings
    eventually(lambda: len(accepted_writes()) > 10, timeout=60, what="the leader writes")
    leader = current_leader()
    stopped = time.monotonic()
    os.kill(leader, signal.SIGSTOP)
    eventually(
        lambda: bool(writes_by_others_after(leader, stopped)), timeout=ttl * 5, what="takeover"
    )
    time.sleep(ttl)  # well past its ttl
    resumed = time.monotonic()
    os.kill(leader, signal.SIGCONT)
    eventually(
        lambda: "Stepped down from tests:fenced-writer (lost)" in fleet.logs()[leader],
        timeout=10,
        what="the old leader steps down",
    )
    log = fleet.logs()[leader]
    assert "detected by deadline" in log
    assert log.count("Lost the leadership of tests:fenced-writer") == 1, log  # not twice
    stale = [w for w in accepted_writes() if w.pid == leader and w.ended > resumed]
    assert stale == [], "a write of the paused leader was accepted after it resumed"
    late = LeaderWrite.objects.using("postgres").filter(
        pid=leader, started__gt=resumed, accepted=False
    )
    print(f"late writes of the paused leader, refused by fencing: {late.count()}")
    check_history()


@pytest.mark.parametrize("store_kind", ["postgres"])  # the output does not depend on the store
def test_with_logging_showing_info_each_line_is_printed_once(fleet, store_kind) -> None:
    [proc] = fleet("30s", count=1, log_level="INFO")
    eventually(lambda: "Leading tests:fenced-writer" in fleet.logs()[proc.pid], timeout=30)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    text = fleet.logs()[proc.pid]
    assert text.count("Leading tests:fenced-writer") == 1, text
    assert text.count("Stepped down from tests:fenced-writer") == 1, text


def test_work_that_overstays_the_grace_still_lets_run_leader_exit_1(tmp_path: Path) -> None:
    """SIGTERM: the work ignores its signal, the grace runs out, the lease is released and the
    process exits 1 (it used to wait for the work's thread)."""
    locks = {"BACKEND": "django_locks.stores.InMemoryStore", "ALLOW_IN_MEMORY_STORAGE": True}
    env = child_env(locks=locks, log_level="NONE")
    command = [sys.executable, "-m", "django", "run_leader", STUBBORN, "--grace", "0.5s"]
    proc = subprocess.Popen(
        [*command, "--settings=tests.leader_settings"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "stubborn work started" in line:
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
