"""``lock.atomic()`` on SQLite files, in WAL and rollback-journal modes (SPEC section 13): each
scenario in processes of their own (tests/children/sqlite_atomic.py), as a project runs them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD = [sys.executable, "-m", "tests.children.sqlite_atomic"]
ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("journal", ["wal", "delete"])]


def scenario(tmp_path: Path, name: str, journal: str) -> dict[str, Any]:
    result = subprocess.run(
        [*CHILD, name, str(tmp_path / "db.sqlite3"), journal, name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr
    facts: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return facts


def test_commits_while_held_adding_one_statement_before_commit(
    tmp_path: Path, journal: str
) -> None:
    facts = scenario(tmp_path, "commit", journal)
    assert facts["outcome"] == "committed" and facts["rows"] == [0, facts["token"]]
    plain, block = facts["plain"], facts["block"]
    assert len(block) == len(plain) + 1, block
    assert block[0] == plain[0] and block[-1] == plain[-1] == "COMMIT"
    assert block[-2].lstrip().startswith("UPDATE django_locks_lease")
    assert facts["deadline_moved"] > 0.1  # the committed check counted as a renewal


def test_a_lease_expired_on_the_file_rolls_the_block_back(tmp_path: Path, journal: str) -> None:
    facts = scenario(tmp_path, "lost", journal)
    assert facts == {
        "outcome": "LockLostError",
        "detected_by": "renewal",
        "rows": [],
        "held": False,
    }


def test_a_failed_commit_leaves_the_deadline_where_the_last_renewal_put_it(
    tmp_path: Path, journal: str
) -> None:
    facts = scenario(tmp_path, "failed_commit", journal)
    assert facts["outcome"].startswith("IntegrityError"), facts
    assert facts["rows"] == [] and facts["deadline_moved"] == 0.0 and facts["held"]


def test_a_lease_asked_for_commits_without_being_extended(tmp_path: Path, journal: str) -> None:
    facts = scenario(tmp_path, "asked", journal)
    assert facts["outcome"] == "committed" and len(facts["rows"]) == 1, facts
    assert facts["extended"] is False and facts["deadline_moved"] == 0.0, facts


def test_a_thread_whose_connection_is_not_open_yet_is_not_refused(
    tmp_path: Path, journal: str
) -> None:
    facts = scenario(tmp_path, "fresh_thread", journal)
    assert facts["outcome"] == "committed" and len(facts["rows"]) == 1, facts


def line(child: subprocess.Popen[str]) -> dict[str, Any]:
    assert child.stdout is not None
    facts: dict[str, Any] = json.loads(child.stdout.readline())
    return facts


def send(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.write("\n")
    child.stdin.flush()


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CHILD, *args],
        cwd=ROOT,
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_competitor_acquires_only_after_the_paused_holder_resumes(
    tmp_path: Path, journal: str
) -> None:
    """The holder, SIGSTOPped inside its block (after a write), keeps the file's write lock:
    no competitor acquires until it resumes; then its check finds the lease lost (the pause
    outlasted the 1 s ttl), its write is rolled back, and the competitor takes the key with a
    higher token."""
    db = str(tmp_path / "db.sqlite3")
    subprocess.run([*CHILD, "commit", db, journal, "setup"], cwd=ROOT, env=ENV, check=True)
    holder = start("hold", db, journal, "k")
    competitor = start("compete", db, journal, "k")
    try:
        token = line(holder)["token"]
        assert line(competitor) == {"ready": True}
        assert line(holder) == {"pause": True}
        holder.send_signal(signal.SIGSTOP)
        send(competitor)
        time.sleep(2.0)  # twice the ttl: the lease has expired on the file's clock
        resumed = time.monotonic()
        holder.send_signal(signal.SIGCONT)
        send(holder)
        ended, taken = line(holder), line(competitor)
    finally:
        for child in (holder, competitor):
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait(10)
    assert ended["outcome"].startswith("LockLostError"), ended
    assert taken["outcome"] == "acquired", taken
    assert taken["at"] > resumed, (taken, resumed)  # not while the holder was paused
    assert taken["token"] > token
    # The setup's two rows, then the competitor's: the paused holder's write is gone.
    assert taken["rows"] == [0, 1, taken["token"]], taken
