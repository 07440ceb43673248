"""The pytest plugin of the ``django-distributed-locks`` distribution: ``locks_reset``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# pytest-django's fixtures that give a test database access (the ``django_db`` mark does too,
# through an autouse fixture of pytest-django's that runs before any fixture of a conftest.py).
DATABASE_FIXTURES = (
    "db",
    "transactional_db",
    "django_db_reset_sequences",
    "django_db_serialized_rollback",
)


@pytest.fixture
def locks_reset(request: pytest.FixtureRequest) -> Iterator[None]:
    """Free every lease of the configured store before and after the test.

    Add it to ``usefixtures``, or make it autouse in your ``conftest.py``. With the database
    store, a test without database access is left alone: the fixture does nothing there (the
    test cannot take a database lock either), so an autouse use is harmless. The store's
    connections are closed before Django destroys the test database, without the fixture.
    """
    from django_locks.service import Locks, locks
    from django_locks.stores.database import DatabaseStore
    from django_locks.testing.reset import reset_locks

    store = locks.store
    if isinstance(store, DatabaseStore) and not _database_allowed(request, store.using):
        yield
        return
    # The service configured now (a LOCKS changed by the test builds another): it frees only
    # the keys of its KEY_PREFIX.
    service = locks._wrapped  # type: ignore[attr-defined]  # the LazyObject's Locks
    assert isinstance(service, Locks)
    reset_locks(service)
    yield
    reset_locks(service)


def _database_allowed(request: pytest.FixtureRequest, using: str) -> bool:
    """Whether the test may use the database ``using``, asked of Django itself.

    Looking for pytest-django's marks and fixtures alone would miss the other ways to get access
    (a ``TestCase`` class, ``django_db_blocker.unblock()`` in a fixture) and the ``databases``
    a test is limited to. So: the test's own database fixtures are set up first (they may come
    after this one), then Django's connection is asked for a cursor, which pytest-django's
    blocker and ``SimpleTestCase`` (or a ``TestCase`` whose ``databases`` leave ``using`` out)
    refuse. The store itself is never touched when the answer is no: before the first test with
    database access, the alias still names the development database.
    """
    from django.db import connections
    from django.test.testcases import DatabaseOperationForbidden  # type: ignore[attr-defined]

    for name in DATABASE_FIXTURES:
        if name in request.fixturenames:
            request.getfixturevalue(name)
    try:
        connections[using].cursor().close()
    except DatabaseOperationForbidden:
        return False
    except RuntimeError as exc:
        if "Database access not allowed" in str(exc):  # pytest-django's blocker
            return False
        raise
    return True
