"""Distributed locks for Django: leases renewed in the background, with fencing tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

__all__ = [
    "AbortSignal",
    "Lock",
    "LockLostError",
    "LockNotAcquiredError",
    "LockReleasedError",
    "Locks",
    "LocksError",
    "StoreError",
    "StoreTimeoutError",
    "current_lock",
    "leader_election",
    "locks",
    "on_one_instance",
    "without_overlapping",
]

if TYPE_CHECKING:
    from django_locks.abort import AbortSignal
    from django_locks.context import current_lock
    from django_locks.decorators import on_one_instance, without_overlapping
    from django_locks.exceptions import (
        LockLostError,
        LockNotAcquiredError,
        LockReleasedError,
        LocksError,
        StoreError,
        StoreTimeoutError,
    )
    from django_locks.leader import leader_election
    from django_locks.lock import Lock
    from django_locks.service import Locks, locks

# Imported on first access, so that `import django_locks` (as INSTALLED_APPS does) needs no
# configured settings and loads no models.
_LAZY = {
    "AbortSignal": "django_locks.abort",
    "current_lock": "django_locks.context",
    "LockLostError": "django_locks.exceptions",
    "LockNotAcquiredError": "django_locks.exceptions",
    "LockReleasedError": "django_locks.exceptions",
    "StoreTimeoutError": "django_locks.exceptions",
    "LocksError": "django_locks.exceptions",
    "StoreError": "django_locks.exceptions",
    "leader_election": "django_locks.leader",
    "Lock": "django_locks.lock",
    "Locks": "django_locks.service",
    "locks": "django_locks.service",
    "on_one_instance": "django_locks.decorators",
    "without_overlapping": "django_locks.decorators",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
