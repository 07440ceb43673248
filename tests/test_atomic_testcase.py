"""``lock.atomic()`` under Django's ``TestCase`` (SPEC section 13): inside the test's wrapping
transaction it runs as a savepoint and checks the lease with a plain read, so a test that takes
a lock, runs a block and releases passes at once; a lost lease still rolls the block back."""

from __future__ import annotations

import time
import unittest
import uuid
from typing import Any

import pytest
from django.db import connections
from django.test import TestCase

from django_locks import Locks
from django_locks.exceptions import LockLostError
from django_locks.stores.database import DatabaseStore
from tests.testapp.models import StockCount

pytestmark = pytest.mark.postgres


class AtomicUnderTestCase(TestCase):
    __test__ = False  # run by the test below, timed
    databases = {"default", "postgres"}

    def setUp(self) -> None:
        self.store = DatabaseStore("postgres")
        self.service = Locks(self.store, ttl="3s")
        self.addCleanup(self.store.close)

    def test_take_write_release(self) -> None:
        name = f"tc:{uuid.uuid4().hex[:8]}"
        with self.service.lock(name) as lock, lock.atomic():
            StockCount.objects.using("postgres").create(product=name, count=1)
        self.assertEqual(StockCount.objects.using("postgres").get(product=name).count, 1)
        self.assertIsNotNone(self.service.acquire(name))  # released, not waiting on anything

    def test_a_lost_lease_rolls_the_savepoint_back(self) -> None:
        name = f"tc:{uuid.uuid4().hex[:8]}"
        lock = self.service.acquire(name)
        assert lock is not None
        self.store.end(name, lock.owner, "released")  # gone behind the lock's back
        with self.assertRaises(LockLostError), lock.atomic():
            StockCount.objects.using("postgres").create(product=name, count=1)
        self.assertFalse(StockCount.objects.using("postgres").filter(product=name).exists())


@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_a_testcase_that_takes_a_lock_and_runs_a_block_passes_in_under_a_second(
    postgres_server: Any,
) -> None:
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(AtomicUnderTestCase)
    connections["postgres"].close()  # TestCase opens its own wrapping transaction
    started = time.monotonic()
    result = unittest.TextTestRunner(verbosity=0).run(suite)
    took = time.monotonic() - started
    assert result.wasSuccessful(), result.failures + result.errors
    assert result.testsRun == 2
    assert took < 1.0, took
