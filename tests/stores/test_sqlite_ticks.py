"""Tick records on SQLite (migration 0007): a table without the columns works as before but for
ticks, which say to migrate (the contract's cases are in test_contract.py)."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from django_locks.exceptions import StoreError
from django_locks.stores.database import DatabaseStore
from django_locks.testing.holder_cases import WORKER

TICK = 1_767_225_600_000


@pytest.mark.django_db(transaction=True)
def test_a_table_without_the_0007_columns_works_as_before_but_for_ticks():
    store = DatabaseStore("default")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_locks_lease RENAME COLUMN tick_ms TO away")
    try:
        token = store.acquire_as("sqlite:tick", "one", 60_000, WORKER)
        assert isinstance(token, int)
        assert store.renew("sqlite:tick", "one", 60_000) is True
        with pytest.raises(StoreError, match="0007_ticks") as caught:
            store.record_tick("sqlite:tick", "one", TICK)
        assert "migrate django_locks --database default" in str(caught.value)
        with pytest.raises(StoreError, match="0007_ticks"):
            store.recorded_tick("sqlite:tick")
        assert store.release("sqlite:tick", "one")
        messages = [m for m in store.check(databases=["default"]) if m.id != "django_locks.W101"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE django_locks_lease RENAME COLUMN away TO tick_ms")
    assert [m.id for m in messages] == ["django_locks.W102"]
    assert "column tick_ms of django_locks_lease is missing" in messages[0].msg
    statements = re.findall(r"run `([^`]+;)`", messages[0].hint)
    assert statements == ["ALTER TABLE django_locks_lease ADD COLUMN tick_ms bigint NULL;"]
    again = store.acquire("sqlite:tick", "two", 60_000)
    assert again is not None and store.record_tick("sqlite:tick", "two", TICK)
    assert store.recorded_tick("sqlite:tick") == (TICK, again)
