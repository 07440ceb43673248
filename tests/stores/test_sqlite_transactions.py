"""SQLite: a store call that would wait on the caller's own transaction fails at once (SPEC 10).

Each scenario runs in a process of its own on a SQLite file (tests/children/sqlite_scenarios.py):
the caller's ``transaction.atomic()`` block, a ``transaction_mode`` option, a TestCase's wrapping
transaction and another process holding the write lock, as a project would meet them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = "Take the lock before entering transaction.atomic()"

pytestmark = pytest.mark.slow


def scenario(tmp_path: Path, name: str, option: str = "") -> dict[str, Any]:
    module = "tests.children.sqlite_scenarios"
    args = [sys.executable, "-m", module, name, str(tmp_path / "db.sqlite3")]
    result = subprocess.run(
        [*args, option] if option else args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    facts: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return facts


def assert_refused_at_once(outcome: dict[str, Any]) -> None:
    assert outcome.get("error") == "OwnTransactionError", outcome
    assert outcome["store_error"]  # a StoreError: never taken for "not acquired"
    assert outcome["seconds"] < 0.15, outcome  # not the 4 s busy timeout
    message = outcome["message"]
    assert FIX in message and "@transaction.non_atomic_requests" in message, message
    assert "ATOMIC_REQUESTS" in message and "PostgreSQL or Redis" in message


def test_an_acquire_after_a_write_inside_atomic_fails_at_once_naming_the_fix(
    tmp_path: Path,
) -> None:
    facts = scenario(tmp_path, "after_a_write")
    assert_refused_at_once(facts["acquire"])
    assert "it wrote" in facts["acquire"]["message"]
    # A release inside the block is refused the same way, having written nothing.
    assert_refused_at_once(facts["release"])
    assert facts["still_taken"]
    assert facts["after"]["value"].startswith("<Lock"), facts["after"]


@pytest.mark.parametrize("mode", ["IMMEDIATE", "EXCLUSIVE"])
def test_with_transaction_mode_immediate_any_open_atomic_block_fails_at_once(
    tmp_path: Path, mode: str
) -> None:
    facts = scenario(tmp_path, "immediate_mode", mode)
    assert_refused_at_once(facts["acquire"])
    assert f"transaction_mode {mode}" in facts["acquire"]["message"]
    assert facts["after"]["value"].startswith("<Lock"), facts["after"]


def test_an_acquire_inside_atomic_that_touched_nothing_works(tmp_path: Path) -> None:
    facts = scenario(tmp_path, "nothing_written")
    assert facts["fresh"]["value"].startswith("<Lock"), facts["fresh"]
    # In the rollback journal a read holds a lock the store's commit waits for: refused too.
    assert_refused_at_once(facts["after_read"])


def test_in_wal_mode_an_acquire_after_a_read_inside_atomic_works(tmp_path: Path) -> None:
    facts = scenario(tmp_path, "nothing_written", "wal")
    assert facts["fresh"]["value"].startswith("<Lock"), facts["fresh"]
    assert facts["after_read"]["value"].startswith("<Lock"), facts["after_read"]


def test_inside_a_testcase_transaction_the_store_writes_through_the_tests_connection(
    tmp_path: Path,
) -> None:
    facts = scenario(tmp_path, "inside_a_testcase")
    assert facts["acquired"] and facts["held_after_1s"], facts
    assert facts["released"] == {"value": "True", "seconds": facts["released"]["seconds"]}


def test_the_renewer_waits_out_a_busy_file_and_is_never_refused(tmp_path: Path) -> None:
    facts = scenario(tmp_path, "renewer_waits")
    assert facts["held"], facts
    assert facts["refusals"] == []
    assert facts["released"]["value"] == "True"
