"""Scenarios of tests/test_release_on_commit_sqlite.py, each in a process of its own on a file.

``python -m tests.children.sqlite_on_commit SCENARIO DB JOURNAL MODE [ARG...]`` configures Django
on the SQLite file ``DB`` (``JOURNAL`` ``wal`` or ``delete``; ``MODE`` ``deferred``, or
``immediate`` for ``transaction_mode`` IMMEDIATE), migrates it and runs the scenario, which prints
its facts as one JSON line. A competitor is another process: ``attempt`` (one try, printing what
it got) or ``compete`` (trying every 20 ms once told to on stdin), both of this module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tests.children.sqlite_file import configure

KEY = "k"
TTL = "30s"


class Boom(Exception):
    pass


def setup(db: str, journal: str, mode: str, *, migrate: bool = True) -> None:
    options: dict[str, Any] = {"timeout": 4, "init_command": f"PRAGMA journal_mode={journal}"}
    if mode == "immediate":
        options["transaction_mode"] = "IMMEDIATE"
    configure(db, options, tables=["app_row (token integer)"], migrate=migrate)


def service(ttl: str = TTL) -> Any:
    from django_locks.service import Locks
    from django_locks.stores.database import DatabaseStore

    return Locks(DatabaseStore(), ttl=ttl)


def write_row(token: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO app_row (token) VALUES (%s)", [token])


def rows() -> list[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT token FROM app_row ORDER BY rowid")
        return [token for (token,) in cursor.fetchall()]


def poll(check: Callable[[], bool], seconds: float) -> float | None:
    """Seconds until ``check()`` held (polled every 10 ms), None if not within ``seconds``."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if check():
            return time.monotonic() - started
        time.sleep(0.01)
    return None


class Child:
    """This module run as another process on the same file (a competitor)."""

    def __init__(self, argv: list[str], scenario: str) -> None:
        db, journal, mode = argv[:3]
        self.args = [sys.executable, "-m", "tests.children.sqlite_on_commit"]
        self.args += [scenario, db, journal, mode]

    def run(self) -> dict[str, Any]:
        done = subprocess.run(self.args, capture_output=True, text=True, timeout=60, check=True)
        facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return facts


# The competitors.


def attempt(argv: list[str]) -> dict[str, Any]:
    """One try at the key (ttl 1 s: its call bounded to well under 1 s), released again at once:
    ``acquired`` (with its token and the rows it sees), ``refused`` (a live lease) or
    ``busy`` (the file's write lock held past the call's bound)."""
    from django_locks.exceptions import StoreError

    try:
        lock = service(ttl="1s").acquire(KEY)
    except StoreError as error:
        return {"outcome": "busy", "error": type(error).__name__}
    if lock is None:
        return {"outcome": "refused"}
    token = lock.fencing_token
    lock.release()
    return {"outcome": "acquired", "token": token, "rows": rows()}


def compete(argv: list[str]) -> dict[str, Any]:
    """Say ready, wait for a line, then try the key every 20 ms (10 s at most): when it was
    taken (``time.monotonic()``, the same clock in every process), with which token, the rows
    it saw, and how often it was refused by the lease or kept out by the write lock."""
    from django_locks.exceptions import StoreError

    locks = service(ttl="1s")
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    started, refused, busy = time.monotonic(), 0, 0
    while time.monotonic() - started < 10:
        try:
            lock = locks.acquire(KEY)
        except StoreError:
            busy += 1
        else:
            if lock is not None:
                at = time.monotonic()
                seen = rows()
                lock.release()
                return {
                    "at": at,
                    "token": lock.fencing_token,
                    "rows": seen,
                    "refused": refused,
                    "busy": busy,
                }
            refused += 1
        time.sleep(0.02)
    return {"at": None, "refused": refused, "busy": busy}


# The holders: a DatabaseStore on the file, the block ending inside transaction.atomic().


def commit(argv: list[str]) -> dict[str, Any]:
    """The block ends inside the transaction (writing a row when ``ARG`` is ``write``); a
    competitor process is told to try while the transaction stays open for 1 s more; then
    the transaction commits. When the competitor got the key, against the commit's times."""
    from django.db import transaction

    write = argv[3:4] == ["write"]
    competitor = subprocess.Popen(
        Child(argv, "compete").args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert competitor.stdin is not None and competitor.stdout is not None
    try:
        assert json.loads(competitor.stdout.readline()) == {"ready": True}
        with transaction.atomic():
            with service().lock(KEY, release="on_commit") as lock:
                if write:
                    write_row(lock.fencing_token)
            pending = lock._keeper.state
            competitor.stdin.write("\n")
            competitor.stdin.flush()
            time.sleep(1.0)
            committing = time.monotonic()
        committed = time.monotonic()
        state = lock._keeper.state
        taken = json.loads(competitor.stdout.readline())
    finally:
        competitor.kill()
        competitor.wait(10)
    return {
        "token": lock.fencing_token,
        "pending": pending,
        "committing": committing,
        "committed": committed,
        "state": state,
        "taken": taken,
    }


def rollback(argv: list[str]) -> dict[str, Any]:
    """The block writes and ends inside the transaction, which then rolls back: the lock's
    state right after, and what a competitor process gets before and after."""
    from django.db import transaction

    try:
        with transaction.atomic():
            with service().lock(KEY, release="on_commit") as lock:
                write_row(lock.fencing_token)
            during = Child(argv, "attempt").run()
            raise Boom
    except Boom:
        state = lock._keeper.state
    return {"state": state, "during": during, "after": Child(argv, "attempt").run()}


def savepoint(argv: list[str]) -> dict[str, Any]:
    """The block ends inside a savepoint that rolls back, the outer transaction open ``HOLD``
    seconds more. ``ARG``s: ``outer`` (the outer transaction wrote before the savepoint) and
    ``block`` (the block wrote). The lock's state right after the savepoint's rollback, what a
    competitor process gets while the outer transaction is open, and how soon after it ends
    the lease is gone from the file; ``lock_ttl`` the lock's ttl."""
    from django.db import transaction

    outer_writes, block_writes = "outer" in argv[3:], "block" in argv[3:]
    hold = float(next((a.split("=")[1] for a in argv[3:] if a.startswith("hold=")), "1"))
    ttl = next((a.split("=")[1] for a in argv[3:] if a.startswith("ttl=")), TTL)
    locks = service(ttl=ttl)
    with transaction.atomic():
        if outer_writes:
            write_row(0)
        try:
            with transaction.atomic():
                with locks.lock(KEY, release="on_commit") as lock:
                    if block_writes:
                        write_row(lock.fencing_token)
                raise Boom
        except Boom:
            pass
        rolled_back = time.monotonic()
        state = lock._keeper.state
        during = Child(argv, "attempt").run()
        time.sleep(max(0.0, hold - (time.monotonic() - rolled_back)))
    ended = time.monotonic()
    freed = poll(lambda: locks.store.lease(KEY) is None, 40)
    return {
        "state": state,
        "during": during,
        "held_open": ended - rolled_back,
        "freed_after_end": freed,
        "after": Child(argv, "attempt").run(),
    }


def closed(argv: list[str]) -> dict[str, Any]:
    """The block writes and ends inside the transaction; then the connection is closed
    (Django drops the callback, the transaction is gone): the lock's state and what a
    competitor process gets, still inside the atomic block."""
    from django.db import connection, transaction

    try:
        with transaction.atomic():
            with service().lock(KEY, release="on_commit") as lock:
                write_row(lock.fencing_token)
            connection.close()
            state = lock._keeper.state
            during = Child(argv, "attempt").run()
            raise Boom
    except Boom:
        pass
    return {"state": state, "during": during, "rows": rows()}


def failing_hook() -> None:
    raise Boom


def failing_callback(argv: list[str]) -> dict[str, Any]:
    """An earlier ``on_commit`` callback (not robust) raises after the commit: how soon the
    lock is released, and what a competitor process gets (and sees committed)."""
    from django.db import transaction

    raised = False
    try:
        with transaction.atomic():
            transaction.on_commit(failing_hook)
            with service().lock(KEY, release="on_commit") as lock:
                write_row(lock.fencing_token)
    except Boom:
        raised = True
    released = poll(lambda: lock._keeper.state == "released", 10)
    return {
        "raised": raised,
        "token": lock.fencing_token,
        "released_after": released,
        "after": Child(argv, "attempt").run(),
    }


def inside_atomic(argv: list[str]) -> dict[str, Any]:
    """``lock(release="on_commit")`` and ``with_lock(..., release="on_commit")`` entered
    inside ``transaction.atomic()`` (IMMEDIATE: it holds the write lock from its start): what
    each raised, how soon, and whether anything was written; then the form that works, the
    lock taken outside the transaction: released at its end, after the commit."""
    from django.db import transaction

    from django_locks.exceptions import StoreError

    locks = service()
    tries: dict[str, Any] = {}
    forms = {
        "lock": lambda: locks.lock(KEY, release="on_commit").__enter__(),
        "with_lock": lambda: locks.with_lock(KEY, lambda: None, release="on_commit"),
    }
    with transaction.atomic():
        for name, form in forms.items():
            started = time.monotonic()
            try:
                form()
                tries[name] = {"error": None}
            except StoreError as error:
                tries[name] = {"error": type(error).__name__, "message": str(error)}
            tries[name]["seconds"] = time.monotonic() - started
    written = locks.store.lease(KEY) is not None
    with locks.lock(KEY, release="on_commit") as lock, transaction.atomic():
        write_row(lock.fencing_token)
    return {
        "tries": tries,
        "written": written,
        "outside": lock._keeper.state,
        "after": Child(argv, "attempt").run(),
    }


SCENARIOS = {
    "attempt": attempt,
    "compete": compete,
    "commit": commit,
    "rollback": rollback,
    "savepoint": savepoint,
    "closed": closed,
    "failing_callback": failing_callback,
    "inside_atomic": inside_atomic,
}


def main() -> None:
    scenario, argv = sys.argv[1], sys.argv[2:]
    setup(*argv[:3], migrate=scenario not in ("attempt", "compete"))
    print(json.dumps(SCENARIOS[scenario](argv)), flush=True)


if __name__ == "__main__":
    main()
