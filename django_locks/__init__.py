"""Distributed locks for Django: leases renewed in the background, with fencing tokens."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

# The public names and the module each lives in, listed once for Python: each is imported on
# first access, so that `import django_locks` (as INSTALLED_APPS does) needs no configured
# settings and loads no models. `__all__` and `dir()` are its keys.
_LAZY = {
    "AbortSignal": "django_locks.abort",
    "current_lock": "django_locks.context",
    "AlreadyQueuedError": "django_locks.exceptions",
    "LockLostError": "django_locks.exceptions",
    "LockNotAcquiredError": "django_locks.exceptions",
    "LockReleasedError": "django_locks.exceptions",
    "LocksError": "django_locks.exceptions",
    "PermitsMismatchError": "django_locks.exceptions",
    "PreemptedError": "django_locks.exceptions",
    "StoreError": "django_locks.exceptions",
    "StoreTimeoutError": "django_locks.exceptions",
    "Holder": "django_locks.holders",
    "leader_election": "django_locks.leader",
    "Lock": "django_locks.lock",
    "Locks": "django_locks.service",
    "locks": "django_locks.service",
    "on_one_instance": "django_locks.decorators",
    "without_overlapping": "django_locks.decorators",
    "limit_concurrency": "django_locks.decorators",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    # The same names for type checkers, which cannot read the table above (re-exported by the
    # `as`); tests/test_public_names.py keeps the two equal.
    from django_locks.abort import AbortSignal as AbortSignal
    from django_locks.context import current_lock as current_lock
    from django_locks.decorators import limit_concurrency as limit_concurrency
    from django_locks.decorators import on_one_instance as on_one_instance
    from django_locks.decorators import without_overlapping as without_overlapping
    from django_locks.exceptions import AlreadyQueuedError as AlreadyQueuedError
    from django_locks.exceptions import LockLostError as LockLostError
    from django_locks.exceptions import LockNotAcquiredError as LockNotAcquiredError
    from django_locks.exceptions import LockReleasedError as LockReleasedError
    from django_locks.exceptions import LocksError as LocksError
    from django_locks.exceptions import PermitsMismatchError as PermitsMismatchError
    from django_locks.exceptions import PreemptedError as PreemptedError
    from django_locks.exceptions import StoreError as StoreError
    from django_locks.exceptions import StoreTimeoutError as StoreTimeoutError
    from django_locks.holders import Holder as Holder
    from django_locks.leader import leader_election as leader_election
    from django_locks.lock import Lock as Lock
    from django_locks.service import Locks as Locks
    from django_locks.service import locks as locks


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        # Kept in the package's namespace: later lookups (``django_locks.locks`` in a hot path)
        # find it there, not through this function and import_module() each time.
        value = globals()[name] = getattr(importlib.import_module(_LAZY[name]), name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(__all__)
