"""Scenarios of tests/test_atomic_sqlite.py, each in a process of its own on a SQLite file.

``python -m tests.children.sqlite_atomic SCENARIO DB JOURNAL [KEY]`` configures Django on the
file ``DB`` (``transaction_mode`` IMMEDIATE; ``JOURNAL`` ``wal`` or ``delete``), migrates it
and runs the scenario, which prints its facts as JSON lines (the last one its outcome).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from tests.children.sqlite_file import configure


def setup(db: str, journal: str) -> None:
    options = {
        "timeout": 4,
        "transaction_mode": "IMMEDIATE",
        "init_command": f"PRAGMA journal_mode={journal}",
    }
    tables = (
        "app_row (n integer, token integer)",
        "app_parent (id integer PRIMARY KEY)",
        "app_child (id integer PRIMARY KEY, parent_id integer REFERENCES app_parent (id) "
        "DEFERRABLE INITIALLY DEFERRED)",
    )
    configure(db, options, tables=tables)


def say(**facts: Any) -> None:
    print(json.dumps(facts), flush=True)


def write_row(token: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO app_row (n, token) VALUES (1, %s)", [token])


def rows() -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT token FROM app_row ORDER BY rowid")
        return [token for (token,) in cursor.fetchall()]


def service(clock: Any = None, ttl: str = "3s") -> Any:
    from django_locks.service import Locks
    from django_locks.stores.database import DatabaseStore

    return Locks(DatabaseStore(), ttl=ttl, clock=clock)


def commit(key: str) -> None:
    """Committed while held: the block added one statement (before COMMIT, none at its start)
    and its check counted as a renewal once committed."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as plain, transaction.atomic():
        write_row(0)
    lock = service().acquire(key)
    time.sleep(0.2)
    before = lock.deadline
    with CaptureQueriesContext(connection) as queries, lock.atomic():
        write_row(lock.fencing_token)
    after = lock.deadline
    lock.release()
    say(
        outcome="committed",
        rows=rows(),
        token=lock.fencing_token,
        plain=[q["sql"] for q in plain.captured_queries],
        block=[q["sql"] for q in queries.captured_queries],
        deadline_moved=after - before,
    )


def lost(key: str) -> None:
    """The lease expired on the file's clock while this process's clock stood still (a
    ManualClock: the holder deadline never passes): the check-and-extend UPDATE finds it gone,
    the block is rolled back and the loss announced."""
    from django_locks.exceptions import LockLostError
    from django_locks.testing import ManualClock

    lock = service(ManualClock(), ttl="500ms").acquire(key)
    time.sleep(0.8)
    try:
        with lock.atomic():
            write_row(lock.fencing_token)
        say(outcome="committed", rows=rows())
    except LockLostError as error:
        say(outcome="LockLostError", detected_by=error.detected_by, rows=rows(), held=lock.held)


def failed_commit(key: str) -> None:
    """A COMMIT that fails after the check (a deferred foreign key): rolled back, and the
    holder's deadline stays where the last committed renewal put it."""
    from django.db import IntegrityError, connection

    lock = service().acquire(key)
    before = lock.deadline
    try:
        with lock.atomic():
            write_row(lock.fencing_token)
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO app_child (parent_id) VALUES (999)")
        outcome = "committed"
    except IntegrityError as error:
        outcome = f"IntegrityError: {error}"
    say(outcome=outcome, rows=rows(), deadline_moved=lock.deadline - before, held=lock.held)
    lock.release()


def asked(key: str) -> None:
    """A replacing run asked for the lease (its preempt request recorded, not yet seen by this
    lock): the block commits (the lease is still this lock's), without extending the lease
    or counting as a renewal."""
    from django_locks.models import Lease

    lock = service().acquire(key)
    lock._keeper.store.preempt(key)
    expires = Lease.objects.get(key=key).expires_at
    before = lock.deadline
    with lock.atomic():
        write_row(lock.fencing_token)
    say(
        outcome="committed",
        rows=rows(),
        extended=Lease.objects.get(key=key).expires_at != expires,
        deadline_moved=lock.deadline - before,
    )


def fresh_thread(key: str) -> None:
    """A thread whose connection is not open yet (a worker's first block): not refused."""
    import threading

    from django.db import connection

    lock = service().acquire(key)
    outcome: list[str] = []

    def block() -> None:
        try:
            with lock.atomic():
                write_row(lock.fencing_token)
            outcome.append("committed")
        except Exception as exc:
            outcome.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()

    thread = threading.Thread(target=block)
    thread.start()
    thread.join(30)
    lock.release()
    say(outcome=outcome[0], rows=rows())


def hold(key: str) -> None:
    """Take ``key`` (ttl 1 s), write inside lock.atomic(), say PAUSE and wait for a line (the
    test SIGSTOPs this process there), then try to commit."""
    from django_locks.exceptions import LockLostError

    lock = service(ttl="1s").acquire(key)
    say(token=lock.fencing_token)
    try:
        with lock.atomic():
            write_row(lock.fencing_token)
            say(pause=True)
            sys.stdin.readline()
        outcome = "committed"
    except LockLostError as error:
        outcome = f"LockLostError {error.detected_by}"
    say(outcome=outcome, at=time.monotonic())


def compete(key: str) -> None:
    """Wait for a line, then try ``key`` every 20 ms until taken (10 s at most): when, and
    with which token; then write a row with it."""
    from django_locks.exceptions import StoreError

    locks = service()
    say(ready=True)
    sys.stdin.readline()
    started, errors = time.monotonic(), 0
    while time.monotonic() - started < 10:
        try:
            lock = locks.acquire(key)
        except StoreError:
            errors += 1  # the file is busy: the paused holder has its write lock
            lock = None
        if lock is not None:
            at = time.monotonic()
            with lock.atomic():
                write_row(lock.fencing_token)
            lock.release()
            say(outcome="acquired", at=at, token=lock.fencing_token, busy=errors, rows=rows())
            return
        time.sleep(0.02)
    say(outcome="not acquired", busy=errors)


def main() -> None:
    scenario, db, journal = sys.argv[1:4]
    key = sys.argv[4] if len(sys.argv) > 4 else "k"
    setup(db, journal)
    scenarios = {
        "commit": commit,
        "lost": lost,
        "failed_commit": failed_commit,
        "hold": hold,
        "asked": asked,
        "fresh_thread": fresh_thread,
        "compete": compete,
    }
    scenarios[scenario](key)


if __name__ == "__main__":
    main()
