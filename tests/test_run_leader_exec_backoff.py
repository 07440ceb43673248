"""``run_leader --exec``: a crash-looping COMMAND backs off (the intervals between its restarts
at least double up to ``--restart-cap``), and a refused renewal (an operator released the lease,
another instance took it) stops the old COMMAND at once, overlapping the next one by at most a
renewal period and the grace (the documented overlap; the fencing token tells them apart)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections

from django_locks.policy import POLICY
from tests.children.exec_fleet import ROOT, Fleet, check_one_at_a_time

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(databases=["default", "postgres"], transaction=True),
]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Instances on the DatabaseStore on PostgreSQL."""
    settings_dict = connections["postgres"].settings_dict
    postgres = {name: settings_dict[name] for name in ("ENGINE", "NAME", "USER", "HOST", "PORT")}
    locks = {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": {"using": "postgres"}}
    made = Fleet(tmp_path, locks, postgres)
    yield made
    made.kill_all()
    print(made.dump())


CAP = 6.0
START_LATENCY = 1.5
"""The most a restart may take beyond its wait (campaign, supervisor and child start) on a
loaded machine; the waits grow by POLICY.exec_restart_allowance so that the intervals double
as long as a restart takes under half of that."""


def test_a_crash_looping_command_backs_off(fleet: Fleet) -> None:
    fleet.start("exec-crash", ["exit", "0", "1"], count=1, options=("--restart-cap", f"{CAP}s"))
    give_up = time.monotonic() + 45
    while len(fleet.terms()) < 5 and time.monotonic() < give_up:
        time.sleep(0.05)
    terms = fleet.terms()
    assert len(terms) >= 5, fleet.dump()
    gaps = [after.start - before.end for before, after in itertools.pairwise(terms)][:4]
    waits = [POLICY.exec_restart_delay(exits, CAP) for exits in range(1, len(gaps) + 1)]
    print("restart gaps (s):", " ".join(f"{gap:.3f}" for gap in gaps))
    print("planned waits (s):", " ".join(f"{wait:g}" for wait in waits))
    assert waits == [0.5, 2.0, 5.0, CAP]
    for gap, wait in zip(gaps, waits, strict=True):
        assert wait <= gap < wait + START_LATENCY, (gaps, waits)
    for before, after in itertools.pairwise(gaps[:3]):
        # The intervals between restarts (each wait and the restart itself) at least double.
        assert after >= 2 * before, gaps
    fleet.stop()


def test_a_refused_renewal_stops_the_command_at_once(fleet: Fleet) -> None:
    first_proc = fleet.start("exec-refused", ["run"], count=1)[0]
    first = fleet.wait_for_child()
    fleet.start("exec-refused", ["run"], count=2)
    time.sleep(0.5)
    released = time.monotonic()
    args = [sys.executable, "-m", "django", "locks", "release", "exec-refused", "--yes"]
    subprocess.run(args, cwd=ROOT, env=fleet.env, check=True, timeout=60, capture_output=True)
    nxt = fleet.wait_for_child(after=first.start)
    give_up = time.monotonic() + 10
    while not next(t for t in fleet.terms() if t.pid == first.pid).stopped:
        assert time.monotonic() < give_up, fleet.dump()
        time.sleep(0.02)
    old = next(t for t in fleet.terms() if t.pid == first.pid)
    overlap = old.end - nxt.start
    period, grace = POLICY.period(2.0), 0.5
    print(
        f"refused renewal: next child {nxt.start - released:.3f}s after the release, "
        f"the old one stopped {old.end - released:.3f}s after it, overlap {overlap:.3f}s"
    )
    assert "detected by renewal" in fleet.log(0)
    assert first_proc.poll() is None  # campaigning again
    fleet.stop()
    check_one_at_a_time(fleet.terms(), overlap=period + grace)
