"""A new project's own tests (copied into a `startproject` by tests/test_fresh_project.py): with
and without database access, under `manage.py test` and pytest-django alike."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import SimpleTestCase, TestCase, TransactionTestCase

from django_locks import LockNotAcquiredError, locks
from django_locks.testing import reset_locks

LEFT_HELD: list[object] = []
"""Locks the tests below take and never release (kept referenced, so they stay renewed)."""


def test_without_database_access() -> None:
    # pytest-django only (Django's runner collects TestCase classes, not functions). First in
    # the module: it runs before any test database exists, while the alias still names the
    # development database.
    assert "shop:export".startswith("shop")


class AbandonedLockTests(TestCase):
    """No reset here: the lock stays held when the test database is torn down. A database kept
    for the next run (--keepdb) must not keep its lease. (Django's runner takes the classes of a
    module in alphabetical order: this one runs before ExportTests resets the store.)"""

    def test_takes_a_lock_and_keeps_it(self) -> None:
        lock = locks.acquire("shop:left-held")
        self.assertIsNotNone(lock)
        LEFT_HELD.append(lock)


class WithoutDatabaseTests(SimpleTestCase):
    def test_no_database_here(self) -> None:
        self.assertTrue("shop:export".startswith("shop:"))


class ExportTests(TestCase):
    def setUp(self) -> None:
        reset_locks()
        self.addCleanup(reset_locks)

    def test_a_lock_inside_a_test_case(self) -> None:
        with locks.lock("shop:export", ttl="10s") as lock:
            self.assertTrue(lock.held)
            with self.assertRaises(LockNotAcquiredError), locks.lock("shop:export"):
                pass
        with locks.lock("shop:export") as again:
            self.assertGreater(again.fencing_token, lock.fencing_token)


def deferred_sqlite() -> bool:
    """startproject's SQLite (no transaction_mode): lock.atomic() refuses it, naming the fix."""
    options = connection.settings_dict.get("OPTIONS", {})
    return connection.vendor == "sqlite" and options.get("transaction_mode") != "IMMEDIATE"


class StockTests(TestCase):
    def test_lock_atomic_inside_a_test_case(self) -> None:
        with locks.lock("shop:stock") as lock:
            if deferred_sqlite():
                with self.assertRaisesMessage(ImproperlyConfigured, "'IMMEDIATE'"):
                    lock.atomic().__enter__()
                return
            with lock.atomic():  # a savepoint of the test's transaction
                User.objects.create(username="stock-keeper")
        self.assertTrue(User.objects.filter(username="stock-keeper").exists())


class StockTransactionTests(TransactionTestCase):
    def test_lock_atomic_commits_while_held(self) -> None:
        with locks.lock("shop:stock", ttl="10s") as lock:
            if deferred_sqlite():
                with self.assertRaisesMessage(ImproperlyConfigured, "'IMMEDIATE'"):
                    lock.atomic().__enter__()
                return
            with lock.atomic():  # committed only while the lease is this lock's
                User.objects.create(username="stock-keeper")
        self.assertTrue(User.objects.filter(username="stock-keeper").exists())


class ExportTransactionTests(TransactionTestCase):
    def test_a_lock_committed_at_once(self) -> None:
        with locks.lock("shop:report") as lock:
            self.assertTrue(lock.held)
            self.assertIsNone(locks.acquire("shop:report"))
            # Committed on the store's own connection: listed while the test's own is idle.
            self.assertIn("shop:report", [lease.key for lease in locks.store.leases()])


# pytest-django only (Django's runner collects TestCase classes, not functions).


@pytest.mark.django_db
def test_the_django_db_mark_takes_a_lock() -> None:
    lock = locks.acquire("shop:nightly")
    assert lock is not None
    LEFT_HELD.append(lock)  # not released: the autouse locks_reset frees it after the test


def test_the_db_fixture_finds_the_lease_freed(db: None) -> None:
    lock = locks.acquire("shop:nightly")
    assert lock is not None
    lock.release()


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_takes_a_lock() -> None:
    with locks.lock("shop:nightly") as lock:
        assert lock.held
