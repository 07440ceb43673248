"""DatabaseStore on SQLite: its checks, and one file shared by the processes of one machine (the
contract is in test_contract.py, transactions in test_sqlite_transactions.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.test import override_settings

from django_locks.stores.database import DatabaseStore

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
    script = textwrap.dedent(f"""
        import os, sys, django
        from django.conf import settings
        settings.configure(
            DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3",
                                     "NAME": {str(tmp_path / "locks.sqlite3")!r}}}}},
            INSTALLED_APPS=["django_locks"], USE_TZ=True,
            LOCKS={{"BACKEND": "django_locks.stores.DatabaseStore"}},
        )
        django.setup()
        from django.core.management import call_command
        from django_locks.stores.database import DatabaseStore
        call_command("migrate", verbosity=0)
        store = DatabaseStore()
        store.acquire("warm-up", "parent", 1000)  # the parent has a connection before forking
        children = []
        for n in range(4):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                won = [store.acquire("shared", f"child-{{n}}-{{i}}", 60_000) for i in range(20)]
                os.write(write, repr(won).encode())
                os._exit(0)
            os.close(write)
            children.append((pid, read))
        results = []
        for pid, read in children:
            os.waitpid(pid, 0)
            results.extend(eval(os.fdopen(read).read()))
        winners = [t for t in results if t is not None]
        assert len(winners) == 1, results
        assert store.acquire("warm-up", "parent", 1000) is not None  # still usable
        assert store.force_release("shared")
        assert store.acquire("shared", "parent", 1000) > winners[0]
        print("ok")
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "ok", result.stderr
