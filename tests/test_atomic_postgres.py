"""``lock.atomic()`` on a real PostgreSQL (SPEC section 13): the commit is conditional on the
lease, checked inside COMMIT by the guard's deferred trigger; a lost lease rolls the block back;
what is refused; the statements it adds (one at the start, one before COMMIT, no commit)."""

from __future__ import annotations

import json
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
from django.db import DatabaseError, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from django_locks import Locks
from django_locks.exceptions import LockLostError, LockReleasedError
from django_locks.models import Lease
from django_locks.signals import lock_lost
from django_locks.stores import InMemoryStore
from django_locks.stores.database import DatabaseStore
from django_locks.stores.database.atomic_sql import GUARD_TABLE
from tests.children.env import child_env
from tests.testapp.models import StockCount
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]


@pytest.fixture
def service() -> Iterator[Locks]:
    store = DatabaseStore("postgres")
    yield Locks(store, ttl="3s")
    store.close()


def key() -> str:
    return f"atomic:{uuid.uuid4().hex[:10]}"


def stock(product: str) -> Any:
    return StockCount.objects.using("postgres").filter(product=product)


@pytest.fixture
def sql(postgres_server: Any) -> Iterator[Any]:
    """A plain connection of the test's own to the test database (autocommit)."""
    conn = postgres_server.connect(connections["postgres"].settings_dict["NAME"])
    yield conn
    conn.close()


def expire(sql: Any, lease_key: str) -> None:
    """The lease's expiry moved into the past on the server's clock, by another session."""
    sql.cursor().execute(
        "UPDATE django_locks_lease SET expires_at = clock_timestamp() - interval '1 second' "
        "WHERE key = %s",
        (lease_key,),
    )


def test_writes_commit_while_the_lease_is_held(service: Locks) -> None:
    name = key()
    with service.lock(name) as lock, lock.atomic():
        StockCount.objects.using("postgres").create(product=name, count=1)
    assert stock(name).get().count == 1
    with connections["postgres"].cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {GUARD_TABLE}")
        assert cursor.fetchone() == (0,)  # the trigger removed its row


def test_a_lease_lost_before_the_commit_rolls_the_block_back(service: Locks, sql: Any) -> None:
    name = key()
    lost: list[Any] = []

    def on_lost(sender: Any, **kwargs: Any) -> None:
        lost.append(kwargs)

    lock_lost.connect(on_lost)
    with service.lock(name) as lock:
        with pytest.raises(LockLostError) as raised:
            with lock.atomic():
                StockCount.objects.using("postgres").create(product=name, count=1)
                expire(sql, name)
        assert raised.value.detected_by == "renewal"
        assert not lock.held
        assert isinstance(lock.signal.reason, LockLostError)
    assert not stock(name).exists()
    try:
        assert eventually(lambda: lost) and lost[0]["key"] == name, lost
    finally:
        lock_lost.disconnect(on_lost)
    assert lost[0]["detected_by"] == "renewal"


SLOW_COMMIT = """
CREATE TABLE atomic_slow_commit (id integer);
CREATE FUNCTION atomic_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER atomic_slow_commit AFTER INSERT ON atomic_slow_commit
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION atomic_slow_commit();
"""


@pytest.fixture
def slow_commit(sql: Any) -> Iterator[None]:
    """A table whose rows make a COMMIT take 2 s (a deferred trigger queued after the guard's,
    as a synchronous standby's slow answer would): the conditional commit stays pending."""
    sql.cursor().execute(SLOW_COMMIT)
    yield
    sql.cursor().execute("DROP TABLE atomic_slow_commit; DROP FUNCTION atomic_slow_commit()")


def test_a_next_holder_waits_for_the_pending_commit_and_gets_a_higher_token(
    service: Locks, slow_commit: None
) -> None:
    name = key()
    other = Locks(DatabaseStore("postgres"))
    got: list[Any] = []
    lock = service.acquire(name, ttl="1s")
    assert lock is not None

    def compete() -> None:
        time.sleep(1.2)  # the lease has expired on the server's clock by then
        started = time.monotonic()
        taken = other.acquire(name, wait=5)
        got.append((taken, time.monotonic() - started, stock(name).exists()))

    thread = threading.Thread(target=compete)
    thread.start()
    with lock.atomic():  # the check passes at COMMIT's start; the commit takes 2 s more
        StockCount.objects.using("postgres").create(product=name, count=1)
        with connections["postgres"].cursor() as cursor:
            cursor.execute("INSERT INTO atomic_slow_commit VALUES (1)")
    thread.join(10)
    taken, waited, saw_the_write = got[0]
    assert taken is not None and taken.fencing_token > lock.fencing_token
    assert saw_the_write  # acquired only once the holder's writes had committed
    assert waited > 0.4, waited  # it waited for the pending commit (2 s from ~0.1 s in)
    taken.release()
    lock.release()
    other.store.close()


def test_the_block_adds_one_statement_at_its_start_and_one_before_commit(
    service: Locks,
) -> None:
    name = key()
    conn = connections["postgres"]
    with CaptureQueriesContext(conn) as plain, transaction.atomic(using="postgres"):
        StockCount.objects.using("postgres").create(product=f"{name}:plain", count=1)
    with service.lock(name) as lock:
        with CaptureQueriesContext(conn) as queries, lock.atomic():
            StockCount.objects.using("postgres").create(product=name, count=1)
    before = [query["sql"] for query in plain.captured_queries]
    statements = [query["sql"] for query in queries.captured_queries]
    assert len(statements) == len(before) + 2, statements
    assert statements[0] == before[0] == "BEGIN"
    assert GUARD_TABLE in statements[1] and "idle_in_transaction" in statements[1]
    assert "statement_timeout" in statements[-2] and statements[-1] == before[-1] == "COMMIT"
    commits = [sql for sql in statements if sql.upper().startswith(("COMMIT", "BEGIN"))]
    assert len(commits) == 2  # its own transaction's BEGIN and COMMIT, nothing more


def test_the_block_sets_both_timeouts_to_the_ttl_for_its_transaction_only(
    service: Locks,
) -> None:
    with service.lock(key(), ttl="7s") as lock:
        with lock.atomic(), connections["postgres"].cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('statement_timeout'), "
                "current_setting('idle_in_transaction_session_timeout')"
            )
            assert cursor.fetchone() == ("7s", "7s")
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout')")
        assert cursor.fetchone() == ("0",)


def test_a_statement_longer_than_the_ttl_is_cancelled(service: Locks) -> None:
    with service.lock(key(), ttl="1s") as lock:
        started = time.monotonic()
        with pytest.raises(DatabaseError), lock.atomic():
            with connections["postgres"].cursor() as cursor:
                cursor.execute("SELECT pg_sleep(5)")
        assert time.monotonic() - started < 3


def test_nesting_is_refused_before_any_sql(service: Locks) -> None:
    with service.lock(key()) as lock:
        with transaction.atomic(using="postgres"):
            with CaptureQueriesContext(connections["postgres"]) as queries:
                with pytest.raises(TransactionManagementError, match="outermost"):
                    with lock.atomic():
                        pass
            assert queries.captured_queries == []


def test_atomic_requests_is_named_in_the_refusal(service: Locks) -> None:
    conn = connections["postgres"]
    conn.settings_dict["ATOMIC_REQUESTS"] = True
    try:
        with service.lock(key()) as lock, transaction.atomic(using="postgres"):
            with pytest.raises(TransactionManagementError, match="non_atomic_requests"):
                with lock.atomic():
                    pass
    finally:
        conn.settings_dict["ATOMIC_REQUESTS"] = False


@pytest.mark.parametrize("level", ["repeatable read", "serializable"])
def test_other_isolation_levels_are_refused_naming_them(service: Locks, level: str) -> None:
    name = key()
    conn = connections["postgres"]
    conn.ensure_connection()
    with conn.cursor() as cursor:
        cursor.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {level}")
    try:
        with service.lock(name) as lock:
            with pytest.raises(TransactionManagementError, match=level.upper()):
                with lock.atomic():
                    StockCount.objects.using("postgres").create(product=name, count=1)
    finally:
        conn.close()
    assert not stock(name).exists()


def test_permits_other_aliases_and_other_stores_are_refused(service: Locks) -> None:
    with service.lock(key(), permits=2) as lock:
        with pytest.raises(ValueError, match="permit"):
            lock.atomic()
    with service.lock(key()) as lock:
        with pytest.raises(ValueError, match="`using`"):
            lock.atomic(using="default")
    with Locks(InMemoryStore()).lock(key()) as lock:
        with pytest.raises(ValueError, match="fenced_update"):
            lock.atomic()


def test_a_released_lock_is_refused_at_entry(service: Locks) -> None:
    lock = service.acquire(key())
    assert lock is not None
    lock.release()
    with pytest.raises(LockReleasedError):
        with lock.atomic():
            pass


def test_lease_rows_untouched_by_the_block(service: Locks) -> None:
    name = key()
    with service.lock(name) as lock:
        before = Lease.objects.using("postgres").get(key=name).expires_at
        with lock.atomic():
            pass
        assert Lease.objects.using("postgres").get(key=name).expires_at == before


def postgres_alias() -> dict[str, Any]:
    settings_dict = connections["postgres"].settings_dict
    return {name: settings_dict[name] for name in ("ENGINE", "NAME", "USER", "HOST", "PORT")}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["after_write", "before_commit"])
def test_a_paused_holder_holds_a_competitor_off_at_most_one_ttl(where: str) -> None:
    """SIGSTOPped inside the block, after its write (before the check) or between its last
    statement and its COMMIT: the next holder acquires, and writes the row the paused block
    locked, within one ttl of the pause; the paused block's write is then gone."""
    name, ttl = key(), 2.0
    StockCount.objects.using("postgres").create(product=name, count=1)
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.children.atomic_holder", where, name, str(ttl)],
        env=child_env(settings="tests.settings", postgres=postgres_alias()),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    other = Locks(DatabaseStore("postgres"))
    try:
        token = json.loads(child.stdout.readline())["token"]
        assert child.stdout.readline().strip() == "PAUSE"
        child.send_signal(signal.SIGSTOP)
        paused = time.monotonic()
        taken, longest = None, 0.0
        while taken is None and time.monotonic() - paused < 10:
            tried = time.monotonic()
            taken = other.acquire(name)  # one try every 20 ms: when it first succeeds
            longest = max(longest, time.monotonic() - tried)
            time.sleep(0 if taken else 0.02)
        acquired = time.monotonic() - paused
        assert taken is not None and taken.fencing_token > token
        with transaction.atomic(using="postgres"):
            with connections["postgres"].cursor() as cursor:  # a failure, not a hang
                cursor.execute("SET LOCAL statement_timeout = '8s'")
            stock(name).update(count=7)  # waits for the paused block's row lock
        wrote = time.monotonic() - paused
        taken.release()
        child.send_signal(signal.SIGCONT)
        child.stdin.write("\n")
        child.stdin.flush()
        ended = json.loads(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait(10)
        other.store.close()
    print(
        f"{where}: acquired {acquired:.2f}s, wrote {wrote:.2f}s after the pause, longest try "
        f"{longest:.3f}s (ttl {ttl}s)"
    )
    assert acquired <= ttl + 0.5, acquired
    assert longest < 0.5, longest  # no try waited on the paused holder
    assert wrote <= ttl + 0.5, wrote
    assert ended["outcome"] != "committed", ended
    assert stock(name).get().count == 7  # the competitor's write stands; the paused one is gone
