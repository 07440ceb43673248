"""``run_leader --exec`` with real children across three instances: at every instant at most one
child runs (checked from the children's own timestamps), through a SIGKILLed or SIGSTOPped
leader, a child that ignores SIGTERM, a child exiting zero and non-zero, and a SIGTERM handover.

Each fault runs once; ``DJANGO_LOCKS_EXEC_FAULT_RUNS=20`` runs each 20 times (by hand; the
figures are in docs/internals/exec.rst). Every test prints its figures (``-s`` shows them).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.children.exec_fleet import Fleet, check_one_at_a_time

RUNS = int(os.environ.get("DJANGO_LOCKS_EXEC_FAULT_RUNS", "1"))
TTL, GRACE = 2.0, 0.5  # the fleet's --ttl 2s --grace 0.5s

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(databases=["default", "postgres"], transaction=True),
]

run = pytest.mark.parametrize("run", range(RUNS))
both_stores = pytest.mark.parametrize(
    "store_kind", ["postgres", pytest.param("redis", marks=pytest.mark.redis)], indirect=True
)


@pytest.fixture(params=["postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fleet(store_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    if store_kind == "redis":
        url = request.getfixturevalue("redis_server").url
        locks: dict[str, Any] = {
            "BACKEND": "django_locks.stores.RedisStore",
            "OPTIONS": {"url": url},
        }
    else:
        locks = {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": {"using": "postgres"}}
    settings_dict = connections["postgres"].settings_dict
    postgres = {name: settings_dict[name] for name in ("ENGINE", "NAME", "USER", "HOST", "PORT")}
    fleet = Fleet(tmp_path, locks, postgres)
    yield fleet
    fleet.kill_all()
    print(fleet.dump())


def lead(fleet: Fleet, mode: list[str], **kwargs: Any) -> Any:
    """Start three instances; the leader's child once it ran half a second."""
    fleet.start("exec-fault", mode, **kwargs)
    first = fleet.wait_for_child()
    time.sleep(0.5)
    return first


@both_stores
@run
def test_sigkill_of_the_leaders_run_leader(fleet: Fleet, run: int) -> None:
    first = lead(fleet, ["run"])
    killed = time.monotonic()
    fleet.leader(first).kill()
    nxt = fleet.wait_for_child(after=first.start)
    old = next(term for term in fleet.terms() if term.pid == first.pid)
    # The closed pipe told the supervisor at once: SIGTERM, and the child recorded its stop.
    assert old.stopped and old.end - killed < 0.5, old
    assert nxt.instance != first.instance
    print(f"SIGKILL: child stopped {old.end - killed:.3f}s after, next {nxt.start - killed:.3f}s")
    fleet.stop()
    print(f"smallest gap {check_one_at_a_time(fleet.terms()):.4f}s")


@run
def test_sigkill_of_the_leaders_run_leader_with_a_child_ignoring_sigterm(
    fleet: Fleet, run: int
) -> None:
    first = lead(fleet, ["ignore-term"])
    killed = time.monotonic()
    fleet.leader(first).kill()
    fleet.wait_for_child(after=first.start)
    old = next(term for term in fleet.terms() if term.pid == first.pid)
    # SIGKILLed by its supervisor after the grace (or at the deadline, if that came first).
    assert not old.stopped
    assert old.end - killed < GRACE + 0.1, old
    print(f"SIGKILL, SIGTERM ignored: child ended {old.end - killed:.3f}s after")
    fleet.stop()
    print(f"smallest gap {check_one_at_a_time(fleet.terms()):.4f}s")


@run
def test_sigstop_of_the_leaders_run_leader(fleet: Fleet, run: int) -> None:
    first = lead(fleet, ["ignore-term"])
    stopped = time.monotonic()
    leader = fleet.leader(first)
    leader.send_signal(signal.SIGSTOP)
    try:
        nxt = fleet.wait_for_child(after=first.start)
        old = next(term for term in fleet.terms() if term.pid == first.pid)
        # Nobody told the supervisor anything: its own timer SIGKILLed the child at the
        # deadline, within a ttl of the last renewal.
        assert not old.stopped and old.end - stopped < TTL, old
        assert nxt.instance != first.instance
    finally:
        leader.send_signal(signal.SIGCONT)
    print(f"SIGSTOP: child ended {old.end - stopped:.3f}s after, next {nxt.start - stopped:.3f}s")
    time.sleep(1.0)  # the resumed instance finds its lease lost and follows
    assert fleet.terms()[-1].pid == nxt.pid
    fleet.stop()
    print(f"smallest gap {check_one_at_a_time(fleet.terms()):.4f}s")


@both_stores
@run
def test_sigterm_hands_over(fleet: Fleet, run: int) -> None:
    first = lead(fleet, ["run"], ttl="30s", grace="8s")  # a campaign every 10 s: only the notice
    leader = fleet.leader(first)
    terminated = time.monotonic()
    leader.send_signal(signal.SIGTERM)
    nxt = fleet.wait_for_child(after=first.start, timeout=12)
    handover = nxt.start - terminated
    print(f"SIGTERM handover: {handover:.3f}s from the signal to the next child's start")
    assert handover < 3.0, fleet.dump()
    assert leader.wait(10) == 0  # the child exited 0 on the forwarded SIGTERM
    fleet.stop()
    print(f"smallest gap {check_one_at_a_time(fleet.terms()):.4f}s")


@run
def test_sigterm_with_a_child_ignoring_it(fleet: Fleet, run: int) -> None:
    first = lead(fleet, ["ignore-term"])
    leader = fleet.leader(first)
    terminated = time.monotonic()
    leader.send_signal(signal.SIGTERM)
    nxt = fleet.wait_for_child(after=first.start)
    old = next(term for term in fleet.terms() if term.pid == first.pid)
    assert not old.stopped and old.end - terminated < GRACE + 0.1, old
    assert leader.wait(10) == 128 + signal.SIGKILL  # the child's end, passed through
    print(
        f"SIGTERM ignored: child ended {old.end - terminated:.3f}s after, next child "
        f"{nxt.start - terminated:.3f}s after"
    )
    fleet.stop()
    print(f"smallest gap {check_one_at_a_time(fleet.terms()):.4f}s")


@pytest.mark.parametrize("code", [0, 3])
@run
def test_a_child_exiting_steps_down(fleet: Fleet, run: int, code: int) -> None:
    first = lead(fleet, ["exit", "1", str(code)])
    nxt = fleet.wait_for_child(after=first.start)
    old = next(term for term in fleet.terms() if term.pid == first.pid)
    assert old.stopped and old.code == code
    print(f"exit {code}: next child {nxt.start - old.end:.3f}s after")
    time.sleep(2.5)
    fleet.stop()
    terms = fleet.terms()
    assert len(terms) >= 3, "the children did not keep taking turns"
    print(f"smallest gap {check_one_at_a_time(terms):.4f}s")
    assert f"exited with code {code} after" in fleet.log(first.instance)


@run
def test_a_killed_supervisor_takes_its_child_and_is_told_as_such(fleet: Fleet, run: int) -> None:
    first = lead(fleet, ["run"])
    supervisor = int(Path(f"/proc/{first.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(supervisor, signal.SIGKILL)
    nxt = fleet.wait_for_child(after=first.start)
    old = next(term for term in fleet.terms() if term.pid == first.pid)
    assert not old.stopped  # SIGKILLed by PR_SET_PDEATHSIG: no clean end recorded
    fleet.stop()
    print(f"supervisor killed: next child {nxt.start - old.end:.3f}s after the old one's end")
    print(f"smallest gap {check_one_at_a_time(fleet.terms()):.4f}s")
    log = fleet.log(first.instance)
    assert "The supervisor of exec-fault was killed by SIGKILL" in log, log
    assert "was ended by SIGKILL (137) after" in log, log
