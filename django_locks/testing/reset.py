"""Clearing leases between tests: they are committed on the store's own connections, so a test's
transaction rollback does not remove them."""

from __future__ import annotations

from django_locks.renewal import held_keepers
from django_locks.service import Locks
from django_locks.stores.base import LockStore


def reset_locks(store: LockStore | Locks | None = None) -> None:
    """Forget every lock this process holds and free the leases of ``store``.

    ``store`` defaults to the configured service (``django_locks.locks``), which frees only the
    keys of ``LOCKS["KEY_PREFIX"]`` (:meth:`Locks.clear() <django_locks.service.Locks.clear>`):
    another project's leases in the same store are left alone. A ``Locks`` frees the keys of
    its own prefix; a ``LockStore`` every lease it holds. Locks still referenced stop being
    renewed without any store call (``held`` becomes False); every key keeps its fencing
    token, so tokens still grow in the next test.
    """
    if store is None:
        from django_locks.service import locks  # the LazyObject, read when called

        store = locks
    for keeper in held_keepers():
        keeper.detach("reset_locks() cleared every lease")
    store.clear()
