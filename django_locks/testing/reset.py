"""Clearing leases between tests: they are committed on the store's own connections, so a test's
transaction rollback does not remove them."""

from __future__ import annotations

from django_locks.renewal import held_keepers
from django_locks.stores.base import LockStore


def reset_locks(store: LockStore | None = None) -> None:
    """Forget every lock this process holds and free every lease of ``store``.

    ``store`` defaults to the configured one (``django_locks.locks.store``). Locks still referenced
    stop being renewed without any store call (``held`` becomes False); every key keeps its
    fencing token, so tokens still grow in the next test.
    """
    if store is None:
        from django_locks.service import locks

        store = locks.store
    for keeper in held_keepers():
        keeper.detach("reset_locks() cleared every lease")
    store.clear()
