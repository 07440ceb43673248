"""DatabaseStore on a real PostgreSQL: what only a server shows (tokens after a sequence reset,
transactions, killed holders, fork, hung calls, test database teardown)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
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
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connections, transaction

from django_locks.exceptions import StoreError, StoreTimeoutError
from django_locks.holders import Holder
from django_locks.models import Lease
from django_locks.stores.database import DatabaseStore
from django_locks.stores.database.operations import SEQUENCE
from django_locks.testing.holder_cases import WORKER
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
    holder = info.holder_info
    assert holder is not None and holder.address == f"{os.uname().nodename}:{os.getpid()}"
    assert (holder.kind, info.holder) == ("process", str(holder))  # a plain acquire()
    assert info.acquired_at is not None and info.acquired_at.tzinfo is not None
    assert info.expires_in is not None and 55 < info.expires_in.total_seconds() <= 60
    assert holder.since == info.acquired_at and holder.expires_at is not None
    assert holder.expires_at.utcoffset() == datetime.timedelta(0)
    assert 59.9 < (holder.expires_at - holder.since).total_seconds() < 60.5


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


def test_a_failed_acquire_that_names_its_holder_is_one_statement(store, sql, postgres_server):
    """Counted by the server itself: with ``log_statement = 'all'`` for the test database's new
    sessions, PostgreSQL logs every statement it receives, prefixed with the pid of the backend
    that received it (``log_line_prefix`` '%m [%p] '); the lines of the store's own session are
    counted in the server's log. A failed acquire was ONE statement before this release (0.1.0
    and 0002: ``SELECT django_locks_acquire(...)``, which answered NULL, holder unknown), and
    still is, the holder now in its answer; so are a plain acquire, renew, leave and end."""
    database = connections["postgres"].settings_dict["NAME"]
    name, rounds = key(), 20
    other = DatabaseStore("postgres")
    query(sql, f"ALTER DATABASE {database} SET log_statement = 'all'")  # for new sessions
    try:
        assert isinstance(other.acquire_as(name, "holder", 60_000, WORKER), int)
        # The store's first call opens its session (the connection's own statements are not
        # an acquire's): counted from the second on.
        assert isinstance(store.acquire_as(name, "refused", 60_000, WORKER), Holder)
        pid = backend_pid(store)
        with open(postgres_server.log, "rb") as log:
            log.seek(0, os.SEEK_END)
            found = [store.acquire_as(name, "refused", 60_000, WORKER) for _ in range(rounds)]
            failed = statements(log, pid)
            assert store.acquire(name, "refused", 60_000) is None
            plain = statements(log, pid)
            mine = key()
            assert isinstance(store.acquire_as(mine, "me", 60_000, WORKER), int)
            assert store.renew(mine, "me", 60_000)
            assert store.leave(mine, "me", 60_000, "lapsed")
            assert store.end(mine, "me", "released")
            others = statements(log, pid)
    finally:
        query(sql, f"ALTER DATABASE {database} RESET log_statement")
        other.close()
    assert all(isinstance(holder, Holder) and holder.detail == WORKER.detail for holder in found)
    assert len(failed) == rounds, failed
    assert len(plain) == 1, plain
    assert len(others) == 4, others
    print(f"{rounds} failed acquires naming their holder: {len(failed)} statements")


def statements(log: Any, pid: int) -> list[str]:
    """The statements the backend ``pid`` logged since the last read of ``log``."""
    logged = re.compile(rf"\[{pid}\] LOG:  (?:statement|execute [^:]*): (.*)")
    lines = log.read().decode(errors="replace").splitlines()
    return [m.group(1) for line in lines if (m := logged.search(line)) is not None]


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
        # This release acquires with 0006's function (0005's, which refuses keys held by
        # permits, clearing a new lease's preempt request) and releases with 0003's (0002's are
        # kept for 0.1.0 processes).
        expected = {"django_locks_acquire_lease": 3, "django_locks_end": 3}
        try:
            eventually(
                lambda: calls() == expected, timeout=10, every=0.05, what="function statistics"
            )
        except AssertionError:
            assert calls() == expected  # shows what was counted instead
    finally:
        query(sql, f"ALTER DATABASE {database} RESET track_functions")
        store.close()


@pytest.mark.parametrize(
    "release",
    ["SELECT django_locks_release(%s, %s)", "SELECT django_locks_end(%s, %s, 'released')"],
    ids=["0002", "0003"],
)
def test_a_release_commits_without_waiting_for_the_disk_in_its_own_transaction_only(
    store, sql, release
):
    name = key()
    assert store.acquire(name, "owner", 60_000) is not None
    query(sql, "BEGIN")
    assert query(sql, release, name, "owner") == (True,)
    assert query(sql, "SHOW synchronous_commit") == ("off",)  # for this commit
    query(sql, "COMMIT")
    assert query(sql, "SHOW synchronous_commit") == ("on",)  # no session state left behind
    assert query(sql, release, name, "owner") == (False,)
    assert query(sql, "SHOW synchronous_commit") == ("on",)  # nothing freed: an ordinary commit
    assert store.acquire(name, "next", 60_000) is not None


FUNCTIONS = {
    "django_locks_acquire(text, text, text, bigint)": "away_a",
    "django_locks_release(text, text)": "away_r",
    "django_locks_acquire_as(text, text, text, text, text, bigint)": "away_as",
    "django_locks_end(text, text, text)": "away_e",
    "django_locks_acquire_plain(text, text, text, text, text, bigint)": "away_ap",
    "django_locks_acquire_permit(text, text, text, text, text, bigint, integer)": "away_pe",
    "django_locks_renew_slots(text[], text[], bigint[], text[], text)": "away_rs",
    "django_locks_end_slot(text, text, text, text, text)": "away_es",
    "django_locks_force_end(text, text)": "away_fe",
    "django_locks_acquire_lease(text, text, text, text, text, bigint)": "away_al",
    "django_locks_acquire_slot(text, text, text, text, text, bigint, integer)": "away_sl",
    "django_locks_renew(text, text, bigint)": "away_rn",
    "django_locks_renew_permits(text[], text[], bigint[], text[])": "away_rp",
    "django_locks_preempt(text)": "away_pr",
}


@contextlib.contextmanager
def functions_away(sql: Any, *signatures: str) -> Iterator[None]:
    """The store's SQL functions of ``signatures`` renamed away meanwhile (a restored dump)."""
    for signature in signatures:
        query(sql, f"ALTER FUNCTION {signature} RENAME TO {FUNCTIONS[signature]}")
    try:
        yield
    finally:
        for signature in signatures:
            name, _, args = signature.partition("(")
            away = f"{FUNCTIONS[signature]}({args}"
            if query(sql, "SELECT to_regprocedure(%s) IS NOT NULL", signature)[0]:
                query(sql, f"DROP FUNCTION {away}")  # made again meanwhile
            else:
                query(sql, f"ALTER FUNCTION {away} RENAME TO {name}")


def test_without_the_sql_functions_the_store_sends_the_statements_and_warns(
    store, sql, caplog
) -> None:
    with functions_away(sql, *FUNCTIONS):
        name = key()
        first = store.acquire_as(name, "one", 60_000, WORKER)
        assert isinstance(first, int)
        # Taken: the statement's answer, without the holder (the functions read it).
        assert store.acquire_as(name, "two", 60_000, WORKER) is None
        assert store.acquire(name, "two", 60_000) is None
        assert store.leave(name, "one", 60_000, "lapsed")
        info = store.lease(name)
        assert info is not None and info.holder_info is not None
        assert (info.holder_info.kind, info.holder_info.detail) == (WORKER.kind, WORKER.detail)
        assert store.end(name, "one", "handed back") and not store.release(name, "one")
        ended = store.lease(name, include_inactive=True)
        assert ended is not None and ended.ended == "handed back"
        second = store.acquire(name, "two", 60_000)
        assert second is not None and second > first
        assert not store._pools.ops.functions
        assert "migrate django_locks --database postgres" in caplog.text
        messages = store.check(databases=["postgres"])
    assert [m.id for m in messages] == ["django_locks.W102"]
    assert "SQL functions" in messages[0].msg
    for signature in FUNCTIONS:
        assert signature.partition("(")[0] in messages[0].msg
    assert store.check(databases=["postgres"]) == []


def test_the_missing_functions_hint_brings_them_back(store, sql) -> None:
    """W102's hint, followed to the letter, makes 0002's and 0003's functions again."""
    name = key()
    assert store.acquire_as(name, "one", 60_000, WORKER) is not None
    with functions_away(sql, *FUNCTIONS):
        (message,) = store.check(databases=["postgres"])
        commands = re.findall(r"`manage.py ([^`]*)`", message.hint)
        assert commands == [
            "migrate django_locks 0002 --database postgres",
            "migrate django_locks 0001 --fake --database postgres",
            "migrate django_locks --database postgres",
        ], message.hint
        for command in commands:
            call_command(*command.split(), verbosity=0)
        assert store.check(databases=["postgres"]) == []
    fresh = DatabaseStore("postgres")
    try:
        found = fresh.acquire_as(name, "two", 60_000, WORKER)
        # Only the function reads the holder of a refused acquire (the statement cannot).
        assert isinstance(found, Holder), "the row and its token survived; the holder is read"
    finally:
        fresh.close()


def test_a_table_without_the_0003_columns_is_a_clear_error_and_a_w102(store, sql) -> None:
    name = key()
    assert store.acquire(name, "one", 60_000) is not None
    query(sql, "ALTER TABLE django_locks_lease RENAME COLUMN holder_kind TO away_kind")
    try:
        with pytest.raises(StoreError, match="migrate django_locks --database postgres") as caught:
            store.acquire_as(key(), "two", 60_000, WORKER)
        assert "0003_holders_and_ends" in str(caught.value)
        with pytest.raises(StoreError, match="migrate django_locks --database postgres"):
            store.leases()
        (message,) = store.check(databases=["postgres"])
    finally:
        query(sql, "ALTER TABLE django_locks_lease RENAME COLUMN away_kind TO holder_kind")
    assert message.id == "django_locks.W102"
    assert "column holder_kind of django_locks_lease is missing" in message.msg
    assert "migrate django_locks 0002 --fake --database postgres" in message.hint
    assert store.renew(name, "one", 60_000)  # usable again at once


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


def test_a_pruner_stopped_mid_batch_holds_the_table_for_seconds_not_until_it_resumes(
    store, monkeypatch
) -> None:
    """prune's batch holds a table lock every acquire waits on: a pruner that stops inside it (a
    client-side pause here, as SIGSTOP or a debugger) is disconnected by the server."""
    from django_locks.stores.database import postgresql
    from django_locks.stores.database.postgresql_sql import PG_PRUNE_LOCK

    stale = key()
    assert store.acquire(stale, "o1", 1) is not None
    time.sleep(0.05)
    real_prune = postgresql.PostgreSQLOperations.prune
    locked = threading.Event()

    class Pausing:
        def __init__(self, cursor: Any) -> None:
            self.cursor = cursor

        def __getattr__(self, name: str) -> Any:
            return getattr(self.cursor, name)

        def execute(self, sql: str, *args: Any) -> Any:
            result = self.cursor.execute(sql, *args)
            if sql == PG_PRUNE_LOCK:
                locked.set()
                time.sleep(6)  # stopped, holding the table lock
            return result

    def pausing_prune(ops: Any, cursor: Any, *args: Any) -> Any:
        return real_prune(ops, Pausing(cursor), *args)

    monkeypatch.setattr(postgresql.PostgreSQLOperations, "prune", pausing_prune)
    failed: list[BaseException] = []

    def prune() -> None:
        try:
            store.prune(0)
        except BaseException as exc:
            failed.append(exc)

    pruner = threading.Thread(target=prune)
    pruner.start()
    assert locked.wait(10)
    other = DatabaseStore("postgres")
    try:
        started = time.monotonic()
        assert other.acquire(key(), "o2", 60_000) is not None
        waited = time.monotonic() - started
    finally:
        other.close()
        pruner.join()
    print(f"\nacquire waited {waited:.2f} s behind a stopped pruner")
    assert waited < 4.5, waited  # 2 s of idleness, then the server ends the pruner's session
    assert failed and isinstance(failed[0], StoreError), failed
    assert store.lease(stale, include_inactive=True) is not None  # its batch rolled back


def test_without_the_atomic_guard_w102_and_lock_atomic_say_to_migrate(store, sql) -> None:
    """0008's guard gone (a restored dump without it): W102 names its function, its hint
    brings it back, and meanwhile lock.atomic() says which migration it needs."""
    from django_locks import Locks

    query(sql, "DROP TABLE django_locks_atomic_guard")
    query(sql, "DROP FUNCTION django_locks_atomic_check()")
    try:
        (message,) = store.check(databases=["postgres"])
        assert "django_locks_atomic_check" in message.msg
        with Locks(store).lock(key()) as lock:
            with pytest.raises(ImproperlyConfigured, match="0008_atomic_guard"), lock.atomic():
                pass
        commands = re.findall(r"`manage.py ([^`]*)`", message.hint)
        assert commands == [
            "migrate django_locks 0007 --database postgres",
            "migrate django_locks --database postgres",
        ], message.hint
        for command in commands:
            call_command(*command.split(), verbosity=0)
    finally:
        call_command("migrate", "django_locks", database="postgres", verbosity=0)
    assert store.check(databases=["postgres"]) == []
    with Locks(store).lock(key()) as lock, lock.atomic():
        pass
