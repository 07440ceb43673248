"""DatabaseStore on a real PostgreSQL: what only a server shows (tokens after a sequence reset,
transactions, killed holders, fork, hung calls, test database teardown)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction

from django_locks.exceptions import StoreError, StoreTimeoutError
from django_locks.models import Lease
from django_locks.stores.database import DatabaseStore
from django_locks.stores.database.operations import SEQUENCE
from tests.children.env import child_env, read
from tests.waiting import eventually

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store() -> Iterator[DatabaseStore]:
    store = DatabaseStore("postgres")
    yield store
    store.close()


@pytest.fixture
def sql(postgres_server: Any) -> Iterator[Any]:
    """A plain connection of the test's own to the test database (autocommit)."""
    conn = postgres_server.connect(connections["postgres"].settings_dict["NAME"])
    yield conn
    conn.close()


def key() -> str:
    return f"pg:{uuid.uuid4().hex[:10]}"


def query(conn: Any, statement: str, *params: Any) -> Any:
    cursor = conn.cursor()
    cursor.execute(statement, params or None)
    return cursor.fetchone() if cursor.description else None


def postgres_alias() -> dict[str, Any]:
    """The test database's `postgres` alias, for a child's DJANGO_LOCKS_TEST_POSTGRES."""
    settings_dict = connections["postgres"].settings_dict
    return {name: settings_dict[name] for name in ("ENGINE", "NAME", "USER", "HOST", "PORT")}


def run_child(*args: str) -> str:
    """Run tests/children/postgres_store.py on the same test database; return its stdout."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.children.postgres_store", *args],
        env=child_env(settings="tests.settings", postgres=postgres_alias()),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def backend_pid(store: DatabaseStore) -> int:
    """The server process of the calling thread's connection of ``store``."""
    raw = store._pools.state.local.conn.raw
    return int(raw.get_backend_pid() if hasattr(raw, "get_backend_pid") else raw.info.backend_pid)


def test_tokens_keep_growing_after_the_sequence_is_reset(store, sql):
    name, tokens = key(), []
    for round_ in range(4):
        owner = uuid.uuid4().hex
        tokens.append(store.acquire(name, owner, 200))
        # A restored backup or a failed-over server: the sequence starts again from 1.
        query(sql, f"ALTER SEQUENCE {SEQUENCE} RESTART WITH 1")
        if round_ % 2:
            assert store.release(name, owner)
        else:

            def expired(owner: str = owner) -> bool:  # on the database's clock
                return not store.renew(name, owner, 1)

            eventually(expired, timeout=10, every=0.02, what="the lease expired")
    tokens.append(store.acquire(name, uuid.uuid4().hex, 30_000))
    assert tokens == sorted(set(tokens)), tokens
    assert tokens[-1] > tokens[0]


def test_a_lock_taken_inside_atomic_is_seen_by_another_process_and_survives_rollback(store):
    name = key()

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic(using="postgres"):
        Lease.objects.using("postgres").count()  # Django's transaction is really open
        token = store.acquire(name, "inside-atomic", 60_000)
        assert token is not None
        seen = run_child("acquire", name, "other", "60000")
        assert seen == "None", "another process must see the lock at once"
        raise Rollback
    assert run_child("acquire", name, "other", "60000") == "None"
    assert store.renew(name, "inside-atomic", 60_000)
    assert store.acquire(name, "inside-atomic", 60_000) == token


def test_a_killed_holders_lease_is_taken_by_another_process_after_ttl(store, sql):
    name, ttl_ms = key(), 2_000
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.children.postgres_store", "hold", name, str(ttl_ms / 1000)],
        env=child_env(settings="tests.settings", postgres=postgres_alias()),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        first = int(holder.stdout.readline())
        time.sleep(1.5)  # the holder renews in the background meanwhile
        killed_at = query(sql, "SELECT clock_timestamp()")[0]
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    finally:
        holder.kill()
    lapsed_at = query(sql, "SELECT expires_at FROM django_locks_lease WHERE key = %s", name)[0]
    taken: list[int] = []

    def survivor_took_it() -> bool:
        token = store.acquire(name, "survivor", 30_000)
        taken.extend([] if token is None else [token])
        return token is not None

    eventually(survivor_took_it, timeout=15, every=0.01, what="the killed holder's lease lapsed")
    second = taken[0]
    taken_at = query(sql, "SELECT acquired_at FROM django_locks_lease WHERE key = %s", name)[0]
    assert second > first
    # On the database's clock: never before the lease lapsed, and at most ttl after the kill.
    assert taken_at >= lapsed_at
    took = (taken_at - killed_at).total_seconds()
    assert took <= ttl_ms / 1000 + 0.5, took
    print(f"taken {took:.3f}s after SIGKILL (ttl {ttl_ms / 1000}s, lapsed at {lapsed_at})")


def test_a_forked_child_uses_connections_of_its_own_and_leaves_the_parents_alone(store, sql):
    name = key()
    assert store.acquire(name, "parent", 60_000) is not None
    parent_backend = backend_pid(store)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a fresh connection, then exit without closing anything
        try:
            token = store.acquire(name + ":child", "child", 60_000)
            os.write(write, json.dumps([token, backend_pid(store)]).encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as fh:
        child_token, child_backend = json.load(fh)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_token is not None
    assert child_backend != parent_backend
    # The parent's session was neither closed nor disturbed by the child.
    assert store.renew(name, "parent", 60_000)
    assert backend_pid(store) == parent_backend
    alive = query(sql, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", parent_backend)
    assert alive[0] == 1


def test_a_call_blocked_by_a_row_lock_times_out_and_is_cancelled_on_the_server(store, sql):
    name = key()
    assert store.acquire(name, "holder", 60_000) is not None
    query(sql, "BEGIN")
    query(sql, "SELECT 1 FROM django_locks_lease WHERE key = %s FOR UPDATE", name)
    try:
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError):
            store.renew(name, "holder", 60_000, timeout=0.3)
        assert time.monotonic() - started < 1.5
        # The abandoned statement does not stay queued behind the row lock on the server.
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        eventually(
            lambda: not query(sql, waiting)[0],
            timeout=10,
            every=0.05,
            what="the abandoned statement cancelled",
        )
    finally:
        query(sql, "ROLLBACK")
    assert store.renew(name, "holder", 60_000)


def test_a_hung_server_process_times_out_the_call_without_help_from_the_server(store):
    name = key()
    assert store.acquire(name, "holder", 60_000) is not None
    backend = backend_pid(store)
    os.kill(backend, signal.SIGSTOP)  # it neither answers nor handles a cancel request
    try:
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError):
            store.renew(name, "holder", 60_000, timeout=0.3)
        assert time.monotonic() - started < 1.0
    finally:
        os.kill(backend, signal.SIGCONT)
    assert store.renew(name, "holder", 60_000)  # on a new connection
    assert backend_pid(store) != backend


def test_connecting_to_a_hung_server_times_out(postgres_server):
    store = DatabaseStore("postgres")
    os.kill(postgres_server.postmaster_pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError):
            store.acquire(key(), "owner", 60_000, timeout=0.5)
        assert time.monotonic() - started < 1.5
    finally:
        os.kill(postgres_server.postmaster_pid, signal.SIGCONT)
        store.close()


def test_a_lost_connection_is_a_store_error_never_a_refusal(store, sql):
    name = key()
    assert store.acquire(name, "holder", 60_000) is not None
    query(sql, "SELECT pg_terminate_backend(%s)", backend_pid(store))
    with pytest.raises(StoreError) as caught:
        store.renew(name, "holder", 60_000)
    assert caught.value.__cause__ is not None
    assert store.renew(name, "holder", 60_000)  # the next call reconnects


def test_leases_are_listed_on_the_databases_clock(store):
    name = key()
    store.acquire(name, "owner", 60_000)
    (info,) = [lease for lease in store.leases() if lease.key == name]
    assert info.state == "held"
    assert info.holder == f"{os.uname().nodename}:{os.getpid()}"
    assert info.acquired_at is not None and info.acquired_at.tzinfo is not None
    assert info.expires_in is not None and 55 < info.expires_in.total_seconds() <= 60


def test_the_table_missing_is_a_warning_only_under_check_database(store, sql):
    assert store.check() == []
    assert store.check(databases=["postgres"]) == []
    query(sql, "ALTER TABLE django_locks_lease RENAME TO django_locks_lease_away")
    try:
        assert store.check() == []  # no I/O without --database: migrate is never blocked
        messages = store.check(databases=["postgres"])
    finally:
        query(sql, "ALTER TABLE django_locks_lease_away RENAME TO django_locks_lease")
    assert [m.id for m in messages] == ["django_locks.W102"]
    assert "migrate" in messages[0].hint


def test_a_release_wakes_one_waiting_thread_of_a_process(store):
    name = key()
    assert store.acquire(name, "holder", 60_000) is not None
    assert not store.wait_for_release(name, 0.5)  # connects the listener; no release yet
    results: list[tuple[bool, float]] = []

    def wait() -> None:
        woken = store.wait_for_release(name, 3)
        results.append((woken, time.monotonic()))

    waiters = [threading.Thread(target=wait) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.3)
    released = time.monotonic()
    assert store.release(name, "holder")
    for waiter in waiters:
        waiter.join(10)
    woken = [at - released for was_woken, at in results if was_woken]
    assert len(results) == 3
    assert len(woken) == 1 and woken[0] < 1  # the others sleep on to their timeout
    assert store.acquire(name, "next", 60_000) is not None
    assert store.release(name, "next")


def test_acquire_and_release_call_the_stores_sql_functions(sql):
    database = connections["postgres"].settings_dict["NAME"]
    query(sql, f"ALTER DATABASE {database} SET track_functions = 'pl'")  # for new sessions
    store = DatabaseStore("postgres")
    try:
        name = key()
        for _ in range(3):
            assert store.acquire(name, "owner", 60_000) is not None
            assert store.release(name, "owner")
        store.close()  # a session reports its statistics at its end at the latest

        def calls() -> dict[str, int]:
            query(sql, "SELECT pg_stat_clear_snapshot()")
            cursor = sql.cursor()
            cursor.execute(
                "SELECT funcname, calls FROM pg_stat_user_functions "
                "WHERE funcname LIKE 'django_locks_%'"
            )
            return dict(cursor.fetchall())

        # Each session reports its statistics now and then, and at its end: wait for them all.
        expected = {"django_locks_acquire": 3, "django_locks_release": 3}
        try:
            eventually(
                lambda: calls() == expected, timeout=10, every=0.05, what="function statistics"
            )
        except AssertionError:
            assert calls() == expected  # shows what was counted instead
    finally:
        query(sql, f"ALTER DATABASE {database} RESET track_functions")
        store.close()


def test_a_release_commits_without_waiting_for_the_disk_in_its_own_transaction_only(store, sql):
    name = key()
    assert store.acquire(name, "owner", 60_000) is not None
    query(sql, "BEGIN")
    assert query(sql, "SELECT django_locks_release(%s, %s)", name, "owner") == (True,)
    assert query(sql, "SHOW synchronous_commit") == ("off",)  # for this commit
    query(sql, "COMMIT")
    assert query(sql, "SHOW synchronous_commit") == ("on",)  # no session state left behind
    assert query(sql, "SELECT django_locks_release(%s, %s)", name, "owner") == (False,)
    assert query(sql, "SHOW synchronous_commit") == ("on",)  # nothing freed: an ordinary commit
    assert store.acquire(name, "next", 60_000) is not None


def test_without_the_sql_functions_the_store_sends_the_statements_and_warns(
    store, sql, caplog
) -> None:
    query(sql, "ALTER FUNCTION django_locks_acquire(text, text, text, bigint) RENAME TO away_a")
    query(sql, "ALTER FUNCTION django_locks_release(text, text) RENAME TO away_r")
    try:
        name = key()
        first = store.acquire(name, "one", 60_000)
        assert first is not None
        assert store.acquire(name, "two", 60_000) is None  # taken: the statement's answer
        assert store.release(name, "one") and not store.release(name, "one")
        second = store.acquire(name, "two", 60_000)
        assert second is not None and second > first
        assert not store._pools.ops.functions
        assert "migrate django_locks --database postgres" in caplog.text
        messages = store.check(databases=["postgres"])
    finally:
        query(sql, "ALTER FUNCTION away_a(text, text, text, bigint) RENAME TO django_locks_acquire")
        query(sql, "ALTER FUNCTION away_r(text, text) RENAME TO django_locks_release")
    assert [m.id for m in messages] == ["django_locks.W102"]
    assert "SQL functions" in messages[0].msg
    assert store.check(databases=["postgres"]) == []


def test_no_table_warning_while_the_migrations_are_not_applied(store, sql):
    # The first `migrate` runs the checks before it creates the table: nothing to say then.
    query(sql, "ALTER TABLE django_locks_lease RENAME TO django_locks_lease_away")
    query(sql, "UPDATE django_migrations SET app = 'django_locks_away' WHERE app = 'django_locks'")
    try:
        messages = store.check(databases=["postgres"])
    finally:
        query(
            sql, "UPDATE django_migrations SET app = 'django_locks' WHERE app = 'django_locks_away'"
        )
        query(sql, "ALTER TABLE django_locks_lease_away RENAME TO django_locks_lease")
    assert messages == []


RUNNER_TESTS = "tests.stores.test_contract.PostgresPooledContract"
SELECTED = "Pooled or timeout or hung or fork or lost or expected"


@pytest.mark.slow
def test_django_test_runner_creates_and_destroys_the_test_database_cleanly(sql):
    env = child_env(settings="tests.settings", postgres={**postgres_alias(), "NAME": "djl_runner"})
    result = subprocess.run(
        [sys.executable, "-m", "django", "test", "--noinput", RUNNER_TESTS],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "being accessed by other users" not in output
    assert "Destroying test database for alias 'postgres'" in output
    gone = query(sql, "SELECT count(*) FROM pg_database WHERE datname = 'test_djl_runner'")
    assert gone[0] == 0, output


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_pytest_django_run_on_each_driver_drops_its_test_database_cleanly(driver):
    args = ["-q", "-p", "no:cacheprovider", "-W", "error::pytest.PytestWarning"]
    args += [
        "tests/stores/test_contract.py::PostgresPooledContract",
        "tests/stores/test_postgres.py",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "tests.children.pytest_on_driver", driver, *args, "-k", SELECTED],
        env=child_env(expect_driver=driver),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Error when trying to teardown test databases" not in output
    assert "being accessed by other users" not in output


def test_connections_use_the_expected_database_driver(store):
    # The per-driver runs name the driver they forced; the main run accepts either.
    expected = read("EXPECT_DRIVER")
    store.acquire(key(), "owner", 1_000)
    driver = type(store._pools.state.local.conn.raw).__module__.split(".")[0]
    assert driver == expected if expected else driver in {"psycopg", "psycopg2"}


def pgbouncer_lets_go() -> None:
    """Close the session's PgBouncer's server connections (if it runs) and wait until it has none:
    its pool keeps idle ones to the test database, which a clone of that database would meet."""
    from tests.servers import postgres

    bouncer = postgres.SERVERS.get(postgres.PGBOUNCER_ALIAS)
    if bouncer is None:
        return

    def servers() -> list[Any]:
        admin = bouncer.postgres.connect("pgbouncer", port=bouncer.port)
        try:
            cursor = admin.cursor()
            cursor.execute("RECONNECT")
            cursor.execute("SHOW SERVERS")
            return list(cursor.fetchall())
        finally:
            admin.close()

    eventually(lambda: servers() == [], timeout=30, what="PgBouncer's server connections closed")


def test_the_parallel_runners_clone_is_made_while_a_store_holds_a_connection(store) -> None:
    """`manage.py test --parallel` clones the test database with it as a template, which
    PostgreSQL refuses while anybody is connected to it: the store lets go first."""
    # Nobody else connected, as where the runner clones: the PgBouncer of the session's
    # PgBouncer contract (tests/stores/test_contract.py, run before this module) keeps a pool.
    pgbouncer_lets_go()
    assert store.acquire(f"clone:{uuid.uuid4().hex[:8]}", "o1", 60_000) is not None
    creation = connections["postgres"].creation
    connections["postgres"].close()  # this test's own connection, as the runner's is closed
    creation.clone_test_db(suffix="clone1", verbosity=0, keepdb=False)
    clone = creation.get_test_db_clone_settings("clone1")["NAME"]
    with connections["postgres"].cursor() as cursor:
        cursor.execute(f'DROP DATABASE "{clone}"')
