"""Owner ids: the secret a holder proves itself by to the store, one per acquire."""

from __future__ import annotations

import itertools
import os

from django_locks import process  # noqa: F401  (its fork hook renews the prefix below)


class _Owners:
    """Owner ids: unique across processes (a random prefix) and in one (a counter), without a
    system call per lock. A forked child draws a prefix of its own: it must never reuse the
    parent's ids, or it could "re-acquire" the parent's leases idempotently."""

    def __init__(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()

    def new(self) -> str:
        return f"{self.prefix}{next(self.counter):016x}"


_owners = _Owners()


def new_owner() -> str:
    """A new owner id, never drawn before by any process."""
    return _owners.new()


def renew_owners_after_fork() -> None:
    """After fork(), in the child (``django_locks.process.AFTER_FORK``)."""
    global _owners
    _owners = _Owners()
