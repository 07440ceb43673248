"""DatabaseStore on SQLite: its checks, and one file shared by the processes of one machine (the
contract is in test_contract.py, transactions in test_sqlite_transactions.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings

from django_locks.stores.database import DatabaseStore
from tests.children.env import child_env

ROOT = Path(__file__).resolve().parents[2]


def test_sqlite_in_production_is_a_warning():
    store = DatabaseStore("default")
    assert [m.id for m in store.check()] == ["django_locks.W101"]
    with override_settings(DEBUG=True):
        assert store.check() == []


@pytest.mark.django_db
def test_the_schema_check_passes_on_a_migrated_sqlite_database():
    store = DatabaseStore("default")
    assert [m.id for m in store.check(databases=["default"])] == ["django_locks.W101"]


@pytest.mark.slow
def test_processes_sharing_a_sqlite_file_see_one_holder_and_growing_tokens(tmp_path):
    db = str(tmp_path / "locks.sqlite3")
    result = subprocess.run(
        [sys.executable, "-m", "tests.children.sqlite_forks", db],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == "ok", result.stderr
