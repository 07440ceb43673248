"""The configured store named for people (the admin, `manage.py locks`, messages), not its repr."""

from __future__ import annotations

from django_locks.stores.base import LockStore


def describe_store(store: LockStore) -> str:
    """``PostgreSQL "default"``, ``SQLite "default"``, ``Redis 127.0.0.1:6379/0``, ``Redis
    Cluster 10.0.0.5:7000``, ``in-memory store (this process only)``; a custom store's class
    name unless it defines ``__str__``: each store's :meth:`~LockStore.__str__`, the one
    place where a store says where its leases live (no I/O, no password)."""
    return str(store)
