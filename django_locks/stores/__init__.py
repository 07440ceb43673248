"""The lock stores: the contract, and the stores django_locks ships.

The implementations are imported on first access so that ``redis`` and the database drivers are
only imported by the projects that use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_locks.stores.base import (
    PERMITS_OWNER,
    LeaseInfo,
    LockStore,
    PermitGrant,
    Slot,
    TickRecord,
)

if TYPE_CHECKING:
    from django_locks.stores.database import DatabaseStore
    from django_locks.stores.etcd import EtcdStore
    from django_locks.stores.memory import InMemoryStore
    from django_locks.stores.redis import RedisStore

__all__ = [
    "PERMITS_OWNER",
    "DatabaseStore",
    "EtcdStore",
    "InMemoryStore",
    "LeaseInfo",
    "LockStore",
    "PermitGrant",
    "RedisStore",
    "Slot",
    "TickRecord",
]

_LAZY = {
    "DatabaseStore": "django_locks.stores.database",
    "EtcdStore": "django_locks.stores.etcd",
    "InMemoryStore": "django_locks.stores.memory",
    "RedisStore": "django_locks.stores.redis",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
