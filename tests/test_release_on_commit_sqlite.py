"""``release="on_commit"`` with a ``DatabaseStore`` on a SQLite file, in WAL and rollback-journal
modes (SPEC section 13): each scenario in a process of its own (tests/children/sqlite_on_commit.py)
and every competitor another process on the same file, as a project runs them.

The block ends inside ``transaction.atomic()`` on the store's alias, which begins DEFERRED: its
acquire comes before the transaction wrote (or, in the rollback journal, read). With
``transaction_mode`` IMMEDIATE the transaction holds the file's write lock from its start, so the
acquire inside it is refused at once (``OwnTransactionError``): ``release="on_commit"`` never
gets to wait for a commit there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD = [sys.executable, "-m", "tests.children.sqlite_on_commit"]
ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
FIX = "Take the lock before entering transaction.atomic()"

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("journal", ["wal", "delete"])]


def scenario(
    tmp_path: Path, name: str, journal: str, *args: str, mode: str = "deferred"
) -> dict[str, Any]:
    result = subprocess.run(
        [*CHILD, name, str(tmp_path / "db.sqlite3"), journal, mode, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env=ENV,
    )
    assert result.returncode == 0, result.stderr
    facts: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    facts["stderr"] = result.stderr
    return facts


def test_a_competitor_process_is_refused_by_the_lease_until_the_commit(
    tmp_path: Path, journal: str
) -> None:
    """The block wrote nothing, so the file's write lock is free: only the lease keeps the
    competitor out (refused, never busy) until the commit, and it gets the key right after."""
    facts = scenario(tmp_path, "commit", journal)
    taken = facts["taken"]
    assert facts["pending"] == "held" and facts["state"] == "released", facts
    assert taken["refused"] > 10 and taken["busy"] == 0, taken  # tried for the whole second
    assert taken["at"] > facts["committing"], (taken, facts)  # not before the commit
    assert taken["at"] - facts["committed"] < 1.0, (taken, facts)  # right after it
    assert taken["token"] > facts["token"]


def test_a_competitor_process_gets_the_key_right_after_the_commit_and_sees_the_write(
    tmp_path: Path, journal: str
) -> None:
    facts = scenario(tmp_path, "commit", journal, "write")
    taken = facts["taken"]
    assert facts["pending"] == "held" and facts["state"] == "released", facts
    assert taken["at"] > facts["committing"], (taken, facts)
    assert taken["at"] - facts["committed"] < 1.0, (taken, facts)
    assert taken["rows"] == [facts["token"]], taken  # the holder's committed write
    assert "failed" not in facts["stderr"], facts["stderr"]


def test_released_at_once_after_an_outer_rollback(tmp_path: Path, journal: str) -> None:
    facts = scenario(tmp_path, "rollback", journal)
    assert facts["during"]["outcome"] != "acquired", facts  # the transaction's write lock
    assert facts["state"] == "released", facts
    assert facts["after"]["outcome"] == "acquired" and facts["after"]["rows"] == [], facts


def test_a_savepoint_rollback_in_a_transaction_that_holds_nothing_frees_the_key_at_once(
    tmp_path: Path, journal: str
) -> None:
    """The block wrote nothing: the outer transaction, still open, holds no lock of the file
    and the competitor process gets the key before it ends."""
    facts = scenario(tmp_path, "savepoint", journal)
    assert facts["state"] == "released", facts
    assert facts["during"]["outcome"] == "acquired", facts
    assert facts["after"]["outcome"] == "acquired", facts


@pytest.mark.parametrize("hold", ["1", "6"])
def test_a_savepoint_rollback_after_the_block_wrote_frees_the_lease_as_the_transaction_ends(
    tmp_path: Path, journal: str, hold: str
) -> None:
    """SQLite keeps the write lock of a rolled-back savepoint's write until the transaction
    ends: no process can write the file meanwhile (the competitor is busy, not refused), and
    the release, handed to a background thread, waits for that lock. It lands within a
    fraction of a second of the outer transaction's end, also after 6 s (past the store's 5 s
    call timeout: the release's bound is the lock's remaining validity, 30 s here)."""
    facts = scenario(tmp_path, "savepoint", journal, "block", f"hold={hold}")
    assert facts["state"] == "released", facts  # stopped renewing at the rollback
    assert facts["during"]["outcome"] == "busy", facts
    assert facts["held_open"] >= float(hold), facts
    assert facts["freed_after_end"] is not None and facts["freed_after_end"] < 0.5, facts
    assert facts["after"]["outcome"] == "acquired" and facts["after"]["rows"] == [], facts
    assert "failed" not in facts["stderr"], facts["stderr"]


def test_a_savepoint_rollback_in_a_transaction_open_past_the_locks_validity_lets_it_lapse(
    tmp_path: Path, journal: str
) -> None:
    """Open longer than the lock's remaining validity (ttl 3 s, 6 s open): the background
    release gives up at the lock's deadline and says so; the lease has lapsed by then, and
    nothing could write the file before the transaction ended anyway."""
    facts = scenario(tmp_path, "savepoint", journal, "block", "hold=6", "ttl=3s")
    assert facts["during"]["outcome"] == "busy", facts
    assert facts["freed_after_end"] is not None and facts["freed_after_end"] < 0.5, facts
    assert facts["after"]["outcome"] == "acquired", facts
    assert "Releasing lock 'k' failed" in facts["stderr"], facts["stderr"]


def test_released_at_once_when_the_connection_closes(tmp_path: Path, journal: str) -> None:
    facts = scenario(tmp_path, "closed", journal)
    assert facts["state"] == "released", facts
    # Still inside the atomic block: the close rolled the write back and freed the file.
    assert facts["during"]["outcome"] == "acquired" and facts["during"]["rows"] == [], facts
    assert facts["rows"] == [], facts


def test_released_despite_an_earlier_failing_on_commit_callback(
    tmp_path: Path, journal: str
) -> None:
    facts = scenario(tmp_path, "failing_callback", journal)
    assert facts["raised"], facts
    # Well before the timer's ttl/3 (10 s): the finalizer saw Django drop the callback.
    assert facts["released_after"] is not None and facts["released_after"] < 1.0, facts
    assert facts["after"]["outcome"] == "acquired", facts
    assert facts["after"]["rows"] == [facts["token"]], facts  # committed before the release


def test_with_transaction_mode_immediate_a_block_inside_atomic_is_refused_at_once(
    tmp_path: Path, journal: str
) -> None:
    """IMMEDIATE (what lock.atomic() needs, W104): the transaction holds the write lock since
    it began, so lock() and with_lock() with release="on_commit" inside it fail at once naming
    the fix, and write nothing. Taken outside the transaction, the lock is released as its
    block ends, after the commit inside it."""
    facts = scenario(tmp_path, "inside_atomic", journal, mode="immediate")
    for form in ("lock", "with_lock"):
        tried = facts["tries"][form]
        assert tried["error"] == "OwnTransactionError", tried
        assert tried["seconds"] < 0.15, tried  # not the busy timeout
        assert FIX in tried["message"] and "transaction_mode IMMEDIATE" in tried["message"]
    assert facts["written"] is False
    assert facts["outside"] == "released"
    assert facts["after"]["outcome"] == "acquired" and len(facts["after"]["rows"]) == 1, facts
