"""``LeaseQueries``: what operators do with a service's leases (list, describe, free, clear,
prune), on the keys of its ``key_prefix`` only, shown without it (SPEC section 3)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING

from django_locks.keys import MAX_KEY_LENGTH, validate_key
from django_locks.slots import base_of
from django_locks.stores.base import LeaseInfo, LockStore, TickRecord, check_older_than

if TYPE_CHECKING:
    from django_locks.lock import Lock

CLEARED_BY = "locks.clear()"
"""Who a lease freed by :meth:`LeaseQueries.clear` was force-released by, as the stores' own
``clear()`` records it."""


class LeaseQueries:
    """The lease queries of :class:`~django_locks.service.Locks` (which inherits them): the
    admin, ``manage.py locks``, ``reset_locks()`` and the health checks go through them, never
    through the store, so that each acts on the keys of this service's ``key_prefix`` alone
    (another project's leases in the same store are neither listed nor touched) and shows them
    without it. With no prefix each is the store's own call.

    A key given to them is the key people see (without the prefix); a ``LeaseInfo`` they return
    is the store's with its ``key`` (a slot's too: ``<key>#<n>``) stripped of the prefix.
    Store failures raise ``StoreError`` as the store does; a store without the optional
    capability raises ``NotImplementedError`` as it does.
    """

    store: LockStore
    key_prefix: str
    ttl_ms: int

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        """The leases of this service's keys, held ones first then by key (as
        :meth:`LockStore.leases <django_locks.stores.base.LockStore.leases>` lists them), each
        key without the prefix; with ``include_inactive`` also expired and released ones,
        where the store keeps them. The slots and the own record of a key taken with permits
        are listed as the store lists them. One store call; ``NotImplementedError`` from a
        store that cannot list."""
        listed = self.store.leases(include_inactive=include_inactive)
        prefix = self.key_prefix
        if not prefix:
            return listed
        return [_without(info, prefix) for info in listed if info.key.startswith(prefix)]

    def lease(self, key: str, *, include_inactive: bool = False) -> LeaseInfo | None:
        """The lease on ``key`` (without the prefix) as :meth:`leases` lists it, or ``None``
        when there is none: its live lease, or with ``include_inactive`` also an expired or
        released one where the store keeps it. One store call. ``TypeError`` / ``ValueError``
        before any I/O for a key that is not valid (the prefix counted towards its 500
        characters)."""
        info = self.store.lease(self._prefixed(key), include_inactive=include_inactive)
        if info is None or not self.key_prefix:
            return info
        return _without(info, self.key_prefix)

    def force_release(self, key: str, *, by: str | None = None) -> bool:
        """Operator action: free whoever holds ``key`` (without the prefix), keeping its
        fencing token; its holder learns it at its next renewal (its signal aborts and
        ``lock_lost`` is sent). ``by`` names who did, recorded where the store keeps how
        leases ended ("admin alice", "cli bob@ops-1"). For a key taken with permits, every
        slot of the key is freed; for a slot's key (``<key>#<n>``), that permit alone.
        Returns ``True`` when a live lease was freed, ``False`` when none held the key."""
        if by is not None and not isinstance(by, str):
            raise TypeError(f"`by` must be a str naming who released it, or None, got {by!r}")
        stored = self._prefixed(key)
        if by is None:
            return self.store.force_release(stored)
        return self.store.force_end(stored, by)

    def clear(self) -> None:
        """Testing aid: free every live lease of this service's keys at once, keeping every
        key's fencing token (what ``reset_locks()`` does between tests). With no prefix,
        the store's own ``clear()`` (every lease of the store); with one, each held lease
        whose key starts with it is force-released (recorded as by ``"locks.clear()"``), one
        store call each after one listing, leaving other keys alone: a lease taken under the
        prefix while it runs may be freed too, as by the store's ``clear()``.
        ``NotImplementedError`` from a store that cannot list its leases."""
        prefix = self.key_prefix
        if not prefix:
            self.store.clear()
            return
        held = [info for info in self.store.leases() if info.key.startswith(prefix)]
        # A key's own record under permits frees its slots with it: they need no call of their own.
        summaries = {info.key for info in held if info.is_summary}
        for info in held:
            if base_of(info) in summaries:
                continue
            self.store.force_end(info.key, CLEARED_BY)

    def prune(self, older_than_ms: int, *, dry_run: bool = False) -> int:
        """Delete the records of this service's leases that ended (released or expired) more
        than ``older_than_ms`` milliseconds ago on the store's clock, never a live lease nor
        another key's record, and never letting a key's fencing token go back (see
        :meth:`LockStore.prune <django_locks.stores.base.LockStore.prune>`). Returns how many
        records were deleted (with ``dry_run``: would be, deleting none); 0 from a store that
        keeps no ended leases. With a prefix the store must prune by key prefix (the database
        store's ``prune(prefix=)``); another store that keeps ended leases raises
        ``NotImplementedError``, since its ``prune()`` would delete other projects' records.
        ``TypeError`` / ``ValueError`` before any I/O for an ``older_than_ms`` that is not an
        ``int`` of 0 or more."""
        check_older_than(older_than_ms)
        store, prefix = self.store, self.key_prefix
        if not prefix or not store.keeps_ended_leases:
            return store.prune(older_than_ms, dry_run=dry_run)
        if not _prunes_by_prefix(type(store)):
            raise NotImplementedError(
                f"{store} cannot prune the records of the keys of one key prefix "
                f"({prefix!r}) alone: its prune() takes no `prefix`"
            )
        return store.prune(older_than_ms, dry_run=dry_run, prefix=prefix)  # type: ignore[call-arg]

    # Tick records (beat's catch_up entries): the store's optional capability.

    def _record_tick(self, lock: Lock, tick_ms: int) -> bool:
        """Record ``tick_ms`` as the tick ``lock`` (an owner lease) publishes next: True once the
        store confirmed it, False when the lease is no longer this holder's. One store call;
        ``ImproperlyConfigured`` for a store without tick records."""
        if not self.store.supports_ticks:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(
                f"on_one_instance(catch_up=True) needs a store that records ticks, and "
                f"{self.store} does not (an optional capability of the store contract): use "
                f"the database, Redis or in-memory store, or catch_up=False"
            )
        key = lock._keeper.lease_key
        return self.store.record_tick(key, lock.owner, tick_ms, timeout=self._ticks_timeout())

    def _recorded_tick(self, key: str) -> TickRecord | None:
        """The tick record of ``key`` (without the prefix); ``None`` when there is none or the
        store does not record ticks. One store call."""
        if not self.store.supports_ticks:
            return None
        return self.store.recorded_tick(self._prefixed(key), timeout=self._ticks_timeout())

    def _ticks_timeout(self) -> float:
        from django_locks.policy import POLICY

        return POLICY.acquire_timeout(self.ttl_ms)

    def _prefixed(self, key: object) -> str:
        """``key`` as the store knows it (the prefix prepended), checked before any I/O."""
        validate_key(key)
        assert isinstance(key, str)
        prefix = self.key_prefix
        if not prefix:
            return key
        if len(prefix) + len(key) > MAX_KEY_LENGTH:
            raise ValueError(
                f"`key` must be 1 to {MAX_KEY_LENGTH} characters with the key prefix "
                f"{prefix!r} counted, got {len(prefix) + len(key)}: {key[:40]!r}..."
            )
        return prefix + key


def _without(info: LeaseInfo, prefix: str) -> LeaseInfo:
    """``info`` with its key stripped of ``prefix`` (which it starts with)."""
    return dataclasses.replace(info, key=info.key[len(prefix) :])


def _prunes_by_prefix(store_type: type[LockStore]) -> bool:
    """Whether stores of ``store_type`` take ``prune(..., prefix=)``."""
    try:
        return "prefix" in inspect.signature(store_type.prune).parameters
    except (TypeError, ValueError):
        return False
