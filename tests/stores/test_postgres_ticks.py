"""Tick records on a real PostgreSQL (migration 0007): every acquire path, this release's and the
previous releases' SQL functions and the statements sent without them, leaves a key's record as
it was; a database without 0007's columns works as before but for ticks, and says how to add
them. (The contract's cases, test_contract.py, check the rules themselves.)"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

from django_locks.exceptions import StoreError
from django_locks.stores.base import TickRecord
from django_locks.stores.database import DatabaseStore
from django_locks.testing.holder_cases import WORKER
from tests.stores.test_postgres import FUNCTIONS, functions_away, query

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]

TICK = 1_767_225_600_000


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
    return f"pgt:{uuid.uuid4().hex[:10]}"


def recorded_and_ended(store: DatabaseStore, name: str) -> TickRecord:
    """``name`` taken, a tick recorded, the lease released: the record left on the row."""
    owner = f"recorder-{uuid.uuid4().hex[:6]}"
    token = store.acquire(name, owner, 60_000)
    assert token is not None and store.record_tick(name, owner, TICK)
    assert store.release(name, owner)
    record = store.recorded_tick(name)
    assert record == (TICK, token)
    return record


PLAIN = "'other:1', NULL, NULL, 60000"
ACQUIRES: dict[str, Callable[[Any, str], Any]] = {
    # What a 0.1.0 process calls (0002), a previous 0.2.0 development release's (0003, 0005),
    # and this release's (0006), each by another owner, on the row carrying a record.
    "0002 django_locks_acquire": lambda sql, name: query(
        sql, "SELECT django_locks_acquire(%s, 'other', 'other:1', 60000)", name
    ),
    "0003 django_locks_acquire_as": lambda sql, name: query(
        sql, f"SELECT taken FROM django_locks_acquire_as(%s, 'other', {PLAIN})", name
    ),
    "0005 django_locks_acquire_plain": lambda sql, name: query(
        sql, f"SELECT taken FROM django_locks_acquire_plain(%s, 'other', {PLAIN})", name
    ),
    "0006 django_locks_acquire_lease": lambda sql, name: query(
        sql, f"SELECT taken FROM django_locks_acquire_lease(%s, 'other', {PLAIN})", name
    ),
    # Permits on the same key: its row becomes the key's own record.
    "0005 django_locks_acquire_permit": lambda sql, name: query(
        sql, f"SELECT taken FROM django_locks_acquire_permit(%s, 'other', {PLAIN}, 3)", name
    ),
    "0006 django_locks_acquire_slot": lambda sql, name: query(
        sql, f"SELECT taken FROM django_locks_acquire_slot(%s, 'other', {PLAIN}, 3)", name
    ),
}


@pytest.mark.parametrize("path", sorted(ACQUIRES))
def test_every_acquire_function_leaves_the_tick_record(store, sql, path) -> None:
    name = key()
    record = recorded_and_ended(store, name)
    (taken,) = ACQUIRES[path](sql, name)
    assert taken is not None and taken > record.fencing_token, path
    assert store.recorded_tick(name) == record, path
    # The same owner's idempotent acquire too, and its renewal: the row as it was.
    ACQUIRES[path](sql, name)
    assert store.recorded_tick(name) == record, path


def test_the_statements_sent_without_the_functions_leave_the_tick_record(store, sql) -> None:
    """A database without any of the store's SQL functions (a restored dump): the acquire and
    release statements this release sends instead leave the record too, and record_tick (a
    statement of its own, never a function) works there as everywhere."""
    name = key()
    with functions_away(sql, *FUNCTIONS):
        record = recorded_and_ended(store, name)
        taken = store.acquire_as(name, "other", 60_000, WORKER)
        assert isinstance(taken, int) and taken > record.fencing_token
        assert store.recorded_tick(name) == record
        assert store.record_tick(name, "other", TICK + 1)
        assert store.recorded_tick(name) == (TICK + 1, taken)
        assert store.end(name, "other", "released")
        assert store.recorded_tick(name) == (TICK + 1, taken)


def test_record_tick_is_judged_on_the_database_s_clock(store, sql) -> None:
    """An expiry moved into the past on the server (as warp() does) refuses the record at once,
    whatever this machine's clock says; a renewal gives the lease back its time."""
    name, owner = key(), "holder"
    token = store.acquire(name, owner, 60_000)
    query(
        sql,
        "UPDATE django_locks_lease SET expires_at = clock_timestamp() - interval '1 ms' "
        "WHERE key = %s",
        name,
    )
    assert store.record_tick(name, owner, TICK) is False
    assert store.recorded_tick(name) is None
    assert store.renew(name, owner, 60_000) is False, "expired for renewals alike"
    newer = store.acquire(name, owner, 60_000)
    assert newer is not None and token is not None and newer > token
    assert store.record_tick(name, owner, TICK) is True
    assert store.recorded_tick(name) == (TICK, newer)


def test_a_table_without_the_0007_columns_works_as_before_but_for_ticks(store, sql) -> None:
    """Migration 0007 not run yet (or a restored dump): acquires, renewals and releases work as
    before (none of them names the columns); record_tick and recorded_tick raise StoreError
    saying to migrate; W102 names the column, its hint the SQL adding it back (SQL: applying 0007
    again would fail on the column still there)."""
    name = key()
    query(sql, "ALTER TABLE django_locks_lease RENAME COLUMN tick_token TO away_token")
    try:
        token = store.acquire_as(name, "one", 60_000, WORKER)
        assert isinstance(token, int)
        assert store.renew(name, "one", 60_000) is True
        assert store.renew_many([(name, "one", 60_000)]) == [True]
        for call in (
            lambda: store.record_tick(name, "one", TICK),
            lambda: store.recorded_tick(name),
        ):
            with pytest.raises(StoreError, match="0007_ticks") as raised:
                call()
            assert "migrate django_locks --database postgres" in str(raised.value)
        assert store.release(name, "one")
        (message,) = store.check(databases=["postgres"])
    finally:
        query(sql, "ALTER TABLE django_locks_lease RENAME COLUMN away_token TO tick_token")
    assert message.id == "django_locks.W102"
    assert "column tick_token of django_locks_lease is missing" in message.msg
    statements = re.findall(r"run `([^`]+;)`", message.hint)
    assert statements == ["ALTER TABLE django_locks_lease ADD COLUMN tick_token bigint NULL;"]
    assert store.check(databases=["postgres"]) == []
    assert store.acquire(name, "two", 60_000) is not None
    assert store.record_tick(name, "two", TICK) is True
