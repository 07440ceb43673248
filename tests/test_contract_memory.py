"""The store contract on InMemoryStore, with its races."""

from __future__ import annotations

from django_locks.stores import InMemoryStore
from django_locks.testing import LockStoreContract


class InMemoryStoreContract(LockStoreContract):
    concurrent_callers = 16

    def make_store(self) -> InMemoryStore:
        return InMemoryStore()
