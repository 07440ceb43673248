"""fenced_update on a real model: a lower token writes nothing, an equal or greater one writes."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_locks import Locks
from django_locks.fencing import fenced_update
from django_locks.stores import InMemoryStore
from tests.testapp.models import StockCount

pytestmark = pytest.mark.django_db


def test_a_lower_token_writes_nothing_an_equal_or_greater_one_writes() -> None:
    StockCount.objects.create(product="apple", count=1)
    rows = StockCount.objects.filter(product="apple")
    assert fenced_update(rows, 5, count=10) == 1
    assert fenced_update(rows, 4, count=99) == 0
    assert StockCount.objects.get().count == 10
    assert fenced_update(rows, 5, count=11) == 1
    assert fenced_update(rows, 6, count=12) == 1
    row = StockCount.objects.get()
    assert (row.count, row.fencing_token) == (12, 6)


def test_it_is_one_statement() -> None:
    StockCount.objects.create(product="apple")
    with CaptureQueriesContext(connection) as queries:
        fenced_update(StockCount.objects.all(), 3, count=1)
    assert len(queries) == 1
    assert queries[0]["sql"].lstrip().upper().startswith("UPDATE")


def test_a_paused_holders_late_write_is_rejected() -> None:
    StockCount.objects.create(product="apple")
    service = Locks(InMemoryStore())
    old = service.acquire("stock")
    assert old is not None
    service.store.force_release("stock")  # as if it expired while the holder was paused
    new = service.acquire("stock")
    assert new is not None
    assert fenced_update(StockCount.objects.all(), new, count=7) == 1
    assert fenced_update(StockCount.objects.all(), old, count=666) == 0
    assert StockCount.objects.get().count == 7


def test_bad_arguments() -> None:
    rows = StockCount.objects.all()
    with pytest.raises(TypeError, match="`token` must be a non-negative int"):
        fenced_update(rows, "5", count=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`token`"):
        fenced_update(rows, -1, count=1)
    with pytest.raises(ValueError, match="must not set 'fencing_token'"):
        fenced_update(rows, 1, fencing_token=9)
    with pytest.raises(ValueError, match="at least one value"):
        fenced_update(rows, 1)
    with pytest.raises(ValueError, match="`fencing_field` must name a FencingTokenField"):
        fenced_update(rows, 1, fencing_field="count", count=2)
