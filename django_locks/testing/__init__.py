"""Testing aids: ``ManualClock``, ``LockStoreContract``, and clearing leases between tests."""

from __future__ import annotations

from django_locks.testing.clock import ManualClock
from django_locks.testing.contract import LockStoreContract
from django_locks.testing.reset import reset_locks

__all__ = ["LockStoreContract", "ManualClock", "reset_locks"]
