"""One acquire round trip of the service, and what the event stream is told of each acquire."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_locks import events
from django_locks.events import Use, store_name
from django_locks.exceptions import StoreTimeoutError
from django_locks.holders import Holder, this_process
from django_locks.lock import Lock
from django_locks.owners import new_owner
from django_locks.policy import POLICY
from django_locks.renewal import Keeper
from django_locks.stores.base import PermitGrant, require_permits, slot_of

if TYPE_CHECKING:
    from django_locks.service import Locks


def try_once(
    locks: Locks,
    key: str,
    ttl_ms: int,
    label: str,
    use: Use,
    permits: int = 1,
    max_hold_ms: int | None = None,
    *,
    owner: str | None = None,
) -> Lock | Holder | None:
    """One acquire round trip with a fresh owner id: the ``Lock``, else who holds the key (as
    the store answered in the same round trip; ``None`` when it cannot say). With ``permits``
    above 1, one of the key's permits, else the holder whose lease ends first. The store sees
    the key with the service's ``key_prefix``; the lock, its events and errors name ``key``.
    ``owner``: an owner id derived by the caller instead (an enqueue-time lease taken over by
    the run, ``django_locks.unique``), whose lease, if live, this acquire extends."""
    if owner is None:
        owner = new_owner()
    holder = this_process()
    clock = locks.clock
    sent = clock.monotonic()
    # The call may take no longer than the lease it asks for would be valid.
    timeout = POLICY.acquire_timeout(ttl_ms)
    store = locks.store
    store_key = locks.key_prefix + key

    def ask() -> int | PermitGrant | Holder | None:
        if permits == 1:
            return store.acquire_as(store_key, owner, ttl_ms, holder, timeout=timeout)
        return store.acquire_permit(store_key, owner, ttl_ms, permits, holder, timeout=timeout)

    if permits != 1:
        require_permits(store, permits)  # before any I/O

    try:
        token = ask()
    except StoreTimeoutError:
        # The store may have granted it before the timeout: acquire is idempotent for the same
        # owner, so one retry recovers the lease (same token) instead of stranding it.
        sent = clock.monotonic()
        token = ask()
    # The lease lives as long as the store grants it (etcd rounds up): renewals and the
    # deadline follow that.
    ttl_ms = store.effective_ttl_ms(ttl_ms)
    permit = None
    if isinstance(token, PermitGrant):
        token, permit = token
    elif not isinstance(token, int):
        return token
    # A store may say the lease's time began before the send (etcd: a shared lease kept alive
    # shortly before): the deadline and renewals count from then.
    lease_key = store_key if permit is None else slot_of(store_key, permit)
    sent -= store.acquired_lag(lease_key, owner)
    keeper = Keeper(
        store=store,
        clock=clock,
        key=key,
        owner=owner,
        fencing_token=token,
        ttl_ms=ttl_ms,
        sent=sent,
        label=label,
        use=use,
        permit=permit,
        store_key=store_key,
        max_hold_ms=max_hold_ms,
    )
    return Lock(keeper)


def told_acquired(locks: Locks, lock: Lock, began: float) -> Lock:
    """Tell the event stream of ``lock``, taken after waiting since ``began``."""
    keeper = lock._keeper
    keeper.told = True
    event = events.Event(
        "acquired",
        keeper.key,
        keeper.label,
        store_name(locks.store),
        keeper.use,
        "acquired",
        keeper.acquired_at - began,
        keeper.fencing_token,
        lock=lock,
    )
    events.emit(event)
    return lock


def told_not_acquired(
    locks: Locks, key: str, label: str, use: Use, outcome: str, began: float
) -> None:
    """Tell the event stream an acquire of ``key`` ended without the lock (``outcome``:
    ``"taken"``, ``"aborted"`` or ``"error"``)."""
    waited = locks.clock.monotonic() - began
    event = events.Event("not_acquired", key, label, store_name(locks.store), use, outcome, waited)
    events.emit(event)
