"""``lock.atomic()`` at its edges, on a real PostgreSQL: any ``using`` but the store's alias
refused before any SQL (hypothesis), entered twice, an exception inside (rolled back, the lock
still held), a job's ``current_lock().atomic()``, a COMMIT whose answer is lost (Django's error
unchanged), a lock lost before the block or inside it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_locks import Locks, current_lock, without_overlapping
from django_locks.atomic import LeaseAtomic
from django_locks.exceptions import LockLostError
from django_locks.stores.database import DatabaseStore
from tests.testapp.models import StockCount

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]


class Boom(Exception):
    pass


@pytest.fixture
def service(postgres_server: Any) -> Iterator[Locks]:
    store = DatabaseStore("postgres")
    yield Locks(store, ttl="5s")
    store.close()


def key() -> str:
    return f"edge:{uuid.uuid4().hex[:10]}"


def stock(product: str) -> Any:
    return StockCount.objects.using("postgres").filter(product=product)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    using=st.one_of(
        st.text(max_size=20).filter(lambda text: text != "postgres"),
        st.integers(),
        st.booleans(),
        st.lists(st.text(max_size=3), max_size=2),
        st.just("default"),
    )
)
def test_any_using_but_the_stores_alias_is_refused_before_any_sql(
    service: Locks, using: Any
) -> None:
    with service.lock(key()) as lock:
        with CaptureQueriesContext(connections["postgres"]) as queries:
            with pytest.raises(ValueError, match="`using` must be the alias of the lock's store"):
                lock.atomic(using=using)
        assert queries.captured_queries == []
        assert lock.held


def test_using_may_name_the_stores_alias(service: Locks) -> None:
    name = key()
    with service.lock(name) as lock, lock.atomic(using="postgres"):
        StockCount.objects.using("postgres").create(product=name, count=1)
    assert stock(name).exists()


def test_a_block_is_entered_once(service: Locks) -> None:
    with service.lock(key()) as lock:
        block = lock.atomic()
        with block:
            pass
        with pytest.raises(RuntimeError, match="entered once"), block:
            pass


def test_an_exception_inside_rolls_back_and_the_lock_stays_held(service: Locks) -> None:
    name = key()
    with service.lock(name) as lock:
        with pytest.raises(Boom), lock.atomic():
            StockCount.objects.using("postgres").create(product=name, count=1)
            raise Boom
        assert lock.held and not lock.signal.aborted
        with lock.atomic():  # and a next block commits
            StockCount.objects.using("postgres").create(product=name, count=2)
    assert [row.count for row in stock(name)] == [2]


def test_a_job_writes_through_current_lock_atomic(postgres_server: Any) -> None:
    name = key()
    config = {"BACKEND": "django_locks.stores.DatabaseStore", "OPTIONS": {"using": "postgres"}}

    @without_overlapping(name)
    def job() -> int:
        lock = current_lock()
        assert lock is not None
        with lock.atomic():
            StockCount.objects.using("postgres").create(product=name, count=lock.fencing_token)
        return lock.fencing_token

    with override_settings(LOCKS=config):
        token = job()
    assert token is not None and stock(name).get().count == token


def test_a_lost_commit_answer_raises_djangos_error_unchanged(
    service: Locks, postgres_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session ends between the block's last statement and its COMMIT (the server went
    away, the route was cut): Django's error, not a LockLostError; the lock is not lost."""
    name = key()
    killer = postgres_server.connect(connections["postgres"].settings_dict["NAME"])
    last = LeaseAtomic._before_commit

    def before_commit(self: LeaseAtomic, conn: Any) -> None:
        last(self, conn)
        pid = conn.connection.info.backend_pid if hasattr(conn.connection, "info") else None
        if pid is None:
            pid = conn.connection.get_backend_pid()
        killer.cursor().execute("SELECT pg_terminate_backend(%s)", (pid,))

    monkeypatch.setattr(LeaseAtomic, "_before_commit", before_commit)
    try:
        with service.lock(name) as lock:
            with pytest.raises(DatabaseError) as raised, lock.atomic():
                StockCount.objects.using("postgres").create(product=name, count=1)
            assert not isinstance(raised.value, LockLostError)
            assert lock.held
    finally:
        killer.close()
        connections["postgres"].close()
    assert not stock(name).exists()


def test_a_lock_lost_before_the_block_is_refused_with_its_loss(service: Locks) -> None:
    name = key()
    lock = service.acquire(name)
    assert lock is not None
    service.store.end(name, lock.owner, "released")
    with pytest.raises(LockLostError), lock.atomic():
        StockCount.objects.using("postgres").create(product=name, count=1)
    assert not stock(name).exists() and not lock.held
    # Refused at once from now on, with the same loss, before any SQL.
    with CaptureQueriesContext(connections["postgres"]) as queries:
        with pytest.raises(LockLostError), lock.atomic():
            pass
    assert queries.captured_queries == []


@pytest.mark.pgbouncer
@pytest.mark.usefixtures("pgbouncer_server")
@pytest.mark.django_db(transaction=True, databases=["default", "postgres", "pgbouncer"])
def test_behind_pgbouncer_in_transaction_mode(postgres_server: Any) -> None:
    """Transaction pooling: the guard row, both timeouts and the check are all transaction-local,
    so the block works through PgBouncer, and the timeouts never leak into the pool."""
    store = DatabaseStore("pgbouncer", listen_using="postgres")
    service = Locks(store, ttl="4s")
    name = key()
    try:
        with service.lock(name) as lock, lock.atomic():
            StockCount.objects.using("pgbouncer").create(product=name, count=1)
        with connections["pgbouncer"].cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('statement_timeout'), "
                "current_setting('idle_in_transaction_session_timeout')"
            )
            assert cursor.fetchone() == ("0", "0")
        again = service.acquire(name)
        assert again is not None
        store.end(name, again.owner, "released")
        with pytest.raises(LockLostError), again.atomic():
            StockCount.objects.using("pgbouncer").create(product=f"{name}:lost", count=1)
    finally:
        store.close()
        connections["pgbouncer"].close()
    assert [
        row.product for row in StockCount.objects.using("postgres").filter(product__startswith=name)
    ] == [name]


@pytest.mark.parametrize("ttl", ["50ms", "24d", "366d"])
def test_any_ttl_bounds_the_block_within_postgresqls_limits(postgres_server: Any, ttl: str) -> None:
    """The shortest and the longest ttl (366 days: past PostgreSQL's largest timeout, which then
    bounds the block) both give settings the server takes."""
    store = DatabaseStore("postgres")
    name = key()
    try:
        with Locks(store, ttl=ttl).lock(name) as lock, lock.atomic():
            with connections["postgres"].cursor() as cursor:
                cursor.execute("SELECT current_setting('statement_timeout')")
                (setting,) = cursor.fetchone()
            StockCount.objects.using("postgres").create(product=name, count=1)
    except LockLostError:
        assert ttl == "50ms"  # a 50 ms lease may lapse on a loaded machine: lost, not committed
        assert not stock(name).exists()
        return
    finally:
        store.close()
    assert setting == {"50ms": "50ms", "24d": "24d", "366d": "2147483647ms"}[ttl]
    assert stock(name).exists()
