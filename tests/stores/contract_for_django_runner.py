"""The contract suite as Django's own test runner finds it (run by test_django_runner.py).

Its name does not start with ``test_`` so pytest does not collect it a second time.
"""

from __future__ import annotations

from django_locks.stores import InMemoryStore
from django_locks.testing import LockStoreContract


class InMemoryStoreContractUnderDjangoRunner(LockStoreContract):
    def make_store(self) -> InMemoryStore:
        return InMemoryStore()
