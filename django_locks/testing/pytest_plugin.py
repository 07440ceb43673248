"""The pytest plugin of the ``django-distributed-locks`` distribution: ``locks_reset``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def locks_reset() -> Iterator[None]:
    """Free every lease of the configured store before and after the test.

    Add it to ``usefixtures`` (or an autouse fixture in your ``conftest.py``). With the database
    store, use it in tests that have database access. It closes the store's connections at the
    end, so the test runner can drop the test database.
    """
    from django_locks.service import locks
    from django_locks.testing.reset import reset_locks

    reset_locks()
    yield
    reset_locks()
    # The store's own connections would keep the test database from being dropped.
    locks.store.close()
