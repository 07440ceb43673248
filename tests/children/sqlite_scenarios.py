"""Scenarios of tests/stores/test_sqlite_transactions.py, each in a process of its own on a file.

``python -m tests.children.sqlite_scenarios SCENARIO DB [transaction_mode|wal]`` configures Django
on the file ``DB``, migrates it, runs the scenario and prints its facts as one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from tests.children.sqlite_file import configure


def setup(db: str, option: str) -> None:
    options: dict[str, Any] = {"timeout": 4}
    if option in ("IMMEDIATE", "EXCLUSIVE"):
        options["transaction_mode"] = option
    if option == "wal":
        options["init_command"] = "PRAGMA journal_mode=WAL"
    configure(db, options, tables=["app_row (n integer)"])


def refused(fn: Any) -> dict[str, Any]:
    """Run ``fn()``; what it raised (or returned) and how long it took."""
    started = time.monotonic()
    try:
        value = fn()
    except Exception as exc:
        return {
            "error": type(exc).__name__,
            "store_error": _is_store_error(exc),
            "message": str(exc),
            "seconds": time.monotonic() - started,
        }
    return {"value": repr(value), "seconds": time.monotonic() - started}


def _is_store_error(exc: BaseException) -> bool:
    from django_locks.exceptions import StoreError

    return isinstance(exc, StoreError)


def write_row() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO app_row (n) VALUES (1)")


def read_row() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM app_row").fetchone()


def locks() -> Any:
    from django_locks.service import Locks
    from django_locks.stores.database import DatabaseStore

    return Locks(DatabaseStore(), ttl="10s")


def after_a_write() -> dict[str, Any]:
    from django.db import transaction

    service = locks()
    held = service.acquire("held-before")  # taken before the block: released inside it
    with transaction.atomic():
        write_row()
        acquire = refused(lambda: service.acquire("k"))
        release = refused(held.release)
    after = refused(lambda: service.acquire("k"))  # the block committed: works again
    # The refused release wrote nothing: the lease is still the store's until its ttl.
    still_taken = service.acquire("held-before") is None
    return {"acquire": acquire, "release": release, "after": after, "still_taken": still_taken}


def immediate_mode() -> dict[str, Any]:
    from django.db import transaction

    service = locks()
    with transaction.atomic():
        acquire = refused(lambda: service.acquire("k"))
    return {"acquire": acquire, "after": refused(lambda: service.acquire("k"))}


def nothing_written() -> dict[str, Any]:
    from django.db import transaction

    service = locks()
    with transaction.atomic():
        fresh = refused(lambda: service.acquire("fresh"))
        read_row()
        after_read = refused(lambda: service.acquire("after-read"))
    return {"fresh": fresh, "after_read": after_read}


def inside_a_testcase() -> dict[str, Any]:
    """A TestCase's wrapping transaction (marked as Django marks it) that wrote."""
    from django.db import transaction

    service = locks()
    outer = transaction.atomic()
    outer._from_testcase = True  # type: ignore[attr-defined]
    outer.__enter__()
    try:
        write_row()
        lock = service.acquire("k", ttl="300ms")
        time.sleep(1.0)  # renewed (through the test's connection) three times or more
        result = {
            "acquired": lock is not None,
            "held_after_1s": lock is not None and lock.held and not lock.signal.aborted,
            "released": refused(lock.release) if lock is not None else None,
        }
    finally:
        outer.__exit__(None, None, None)
    return result


def renewer_waits(db: str) -> dict[str, Any]:
    """The renewer meets a busy file (another process's write lock, then this thread's own
    transaction that wrote): errors it retries, never a refusal; the lock stays held."""
    import logging

    from django.db import transaction

    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("django_locks").addHandler(Collect())
    logging.getLogger("django_locks").setLevel(logging.DEBUG)
    service = locks()
    # The ttl leaves room for both busy spells (1.4 s) after a renewal period (ttl/3) on a
    # loaded machine: a 1.5 s ttl was lost when CI was slow to start the other process.
    lock = service.acquire("k", ttl="4s")
    assert lock is not None
    other = subprocess.Popen(
        [sys.executable, "-m", "tests.children.sqlite_writer", db],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert other.stdout is not None and other.stdout.readline().strip() == "locked"
    other.wait(10)
    with transaction.atomic():
        write_row()  # this thread's own transaction holds the write lock for 0.7 s
        time.sleep(0.7)
    time.sleep(1.6)  # renewals after both (one period is 1.33 s): confirmed again
    return {
        "held": lock.held and not lock.signal.aborted,
        "refusals": [r for r in records if "cannot write to the SQLite" in r],
        "released": refused(lock.release),
    }


def main() -> None:
    scenario, db = sys.argv[1], sys.argv[2]
    option = sys.argv[3] if len(sys.argv) > 3 else ""
    setup(db, option)
    scenarios = {
        "after_a_write": after_a_write,
        "immediate_mode": immediate_mode,
        "nothing_written": nothing_written,
        "inside_a_testcase": inside_a_testcase,
        "renewer_waits": lambda: renewer_waits(db),
    }
    print(json.dumps(scenarios[scenario]()))


if __name__ == "__main__":
    main()
