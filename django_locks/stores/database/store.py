"""``DatabaseStore``: leases in the project's own database (PostgreSQL; SQLite on one machine).

Each method states its operation once and runs it through the dialect of the alias's vendor
(``postgresql.py``, ``sqlite.py``) on a connection of the store's own (``pools.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, get_args

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections

from django_locks.durations import Duration, timeout_seconds
from django_locks.holders import KINDS, MAX_DETAIL, Holder
from django_locks.keys import check_permits
from django_locks.process import ProcessLocal
from django_locks.stores.base import (
    MAX_ENDED_BY,
    LeaseInfo,
    LeaveReason,
    LockStore,
    PermitGrant,
    ReleaseReason,
    Renewed,
    TickRecord,
    check_older_than,
    holder_name,
)
from django_locks.stores.database.checks import configuration_messages, store_messages
from django_locks.stores.database.listener import Listener
from django_locks.stores.database.operations import holder_of, lease_info
from django_locks.stores.database.pools import Pools
from django_locks.stores.database.teardown import track
from django_locks.stores.ticks import check_tick_ms

RELEASE_REASONS: tuple[ReleaseReason, ...] = get_args(ReleaseReason)
LEAVE_REASONS: tuple[LeaveReason, ...] = get_args(LeaveReason)

MAX_ADDRESS = 255
"""The longest ``host:pid`` kept (the ``holder`` column)."""

_VENDORS = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}

PRUNE_BATCH = 1000
"""Rows deleted per transaction by ``prune`` on PostgreSQL: each batch blocks the store's writes
briefly."""


class DatabaseStore(LockStore):
    """Leases in the ``Lease`` table of the database ``using``, on connections of the store's own.

    Options (``LOCKS["OPTIONS"]``): ``using``, the ``DATABASES`` alias (PostgreSQL, or SQLite
    for one machine); ``timeout``, the default bound of one call (a duration, 5 s);
    ``max_connections``, ``None`` for one connection per thread that uses the store, or a number
    of connections shared by the threads' acquire and release calls (renewals always keep a
    connection per thread, so requests cannot starve the renewer); and ``listen_using``, where
    waiters ``LISTEN`` for release notices on PostgreSQL: ``True`` (the ``using`` alias), the
    alias of a direct connection when ``using`` goes through PgBouncer in transaction mode, or
    ``False`` (waiters sleep through their backoff).

    Never the request's connection: a lock taken inside ``transaction.atomic()`` is committed at
    once and survives a rollback. Connects from the alias's current ``settings_dict`` (test
    databases included) on first use; safe from any thread and across ``fork()``; ``close()``
    closes every connection of this process. SQLite's in-memory test database (shared cache)
    goes through Django's own connection, since a second connection would find it locked.
    """

    def __init__(
        self,
        using: str = DEFAULT_DB_ALIAS,
        *,
        timeout: Duration = 5,
        max_connections: int | None = None,
        listen_using: str | bool = True,
    ) -> None:
        if not isinstance(using, str) or not using:
            raise ImproperlyConfigured(
                f"DatabaseStore's `using` must be an alias of DATABASES, got {using!r}."
            )
        self.using = using
        try:
            self.timeout = timeout_seconds(timeout, name="timeout")
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"DatabaseStore: {exc}.") from exc
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ImproperlyConfigured(
                "DatabaseStore's `max_connections` must be a positive int or None (one "
                f"connection per thread), got {max_connections!r}."
            )
        self.max_connections = max_connections
        if listen_using is True:
            listen_using = using
        if listen_using is not False and (not isinstance(listen_using, str) or not listen_using):
            raise ImproperlyConfigured(
                "DatabaseStore's `listen_using` must be True (listen on `using`), an alias of "
                f"DATABASES that reaches PostgreSQL directly, or False, got {listen_using!r}."
            )
        self.listen_using: str | None = listen_using or None
        # One per store and process (a forked child makes its own; the parent's session is never
        # closed there): two made at once, one would be lost with its session open (close() could
        # not reach it, and a test database could not be dropped).
        self._listeners: ProcessLocal[Listener] = ProcessLocal(self._new_listener)
        for message in configuration_messages(using):
            raise ImproperlyConfigured(f"{message.msg} {message.hint}")
        self._pools = Pools(self)
        track(self)  # closes its connections before Django destroys a test database

    def __repr__(self) -> str:
        return f"<DatabaseStore using={self.using!r}>"

    def __str__(self) -> str:
        """``PostgreSQL "default"``, ``SQLite "default"``."""
        vendor = connections[self.using].vendor if self.using in connections else "database"
        return f'{_VENDORS.get(vendor, vendor)} "{self.using}"'

    # The contract.

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        # As acquire_as() with nothing known but the address: the lease reads as a "process".
        pools = self._pools
        taken = pools.run(
            pools.ops.acquire_as,
            (key, owner, holder_name(), None, None, ttl_ms),
            timeout,
            renewal=False,
        )
        return taken if isinstance(taken, int) else None

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        pools = self._pools
        return pools.run(pools.ops.renew, (key, owner, ttl_ms), timeout, renewal=True)

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> list[Renewed]:
        if not leases:
            return []
        pools = self._pools
        answers = pools.run(pools.ops.renew_many, (leases,), timeout, renewal=True)
        return [answers.get((key, owner), False) for key, owner, _ in leases]

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        pools = self._pools
        return pools.run(pools.ops.end, (key, owner, "released"), timeout, renewal=False)

    # Holders and how leases end: each recorded by the statement (or function) of the call
    # itself, so no call costs a round trip more than before.

    describes_holders = True

    def acquire_as(
        self, key: str, owner: str, ttl_ms: int, holder: Holder, *, timeout: float | None = None
    ) -> int | Holder | None:
        if not isinstance(holder, Holder):
            raise TypeError(f"`holder` must be a django_locks Holder, got {holder!r}")
        kind = holder.kind if holder.kind in KINDS else "process"
        args = (key, owner, holder.address[:MAX_ADDRESS], kind, holder.detail[:MAX_DETAIL], ttl_ms)
        pools = self._pools
        taken = pools.run(pools.ops.acquire_as, args, timeout, renewal=False)
        return taken if taken is None or isinstance(taken, int) else holder_of(taken)

    def end(
        self, key: str, owner: str, how: ReleaseReason, *, timeout: float | None = None
    ) -> bool:
        if how not in RELEASE_REASONS:
            raise ValueError(f"`how` must be one of {', '.join(RELEASE_REASONS)}, got {how!r}")
        pools = self._pools
        return pools.run(pools.ops.end, (key, owner, how), timeout, renewal=False)

    def leave(
        self, key: str, owner: str, ttl_ms: int, how: LeaveReason, *, timeout: float | None = None
    ) -> bool:
        if how not in LEAVE_REASONS:
            raise ValueError(f"`how` must be one of {', '.join(LEAVE_REASONS)}, got {how!r}")
        pools = self._pools
        return pools.run(pools.ops.leave, (key, owner, ttl_ms, how), timeout, renewal=True)

    def force_end(self, key: str, by: str) -> bool:
        if not isinstance(by, str):
            raise TypeError(f"`by` must be a str naming who released it, got {by!r}")
        pools = self._pools
        return (
            pools.run(pools.ops.force_end, (key, by[:MAX_ENDED_BY] or None), None, renewal=False)
            == 1
        )

    # Permits: slot rows `<key>#<n>` beside the key's own row (SPEC section 4), where the
    # vendor's dialect offers them. The other operations pass a Slot key on to the dialect.

    @property
    def supports_permits(self) -> bool:  # type: ignore[override]
        return self._pools.ops.supports_permits

    def acquire_permit(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        permits: int,
        holder: Holder,
        *,
        timeout: float | None = None,
    ) -> PermitGrant | Holder | None:
        if not isinstance(holder, Holder):
            raise TypeError(f"`holder` must be a django_locks Holder, got {holder!r}")
        if check_permits(permits) < 2:
            raise ValueError(f"`permits` of acquire_permit() must be 2 or more, got {permits!r}")
        pools = self._pools
        if not pools.ops.supports_permits:
            raise NotImplementedError(f"{self} does not offer permits")
        kind = holder.kind if holder.kind in KINDS else "process"
        address, detail = holder.address[:MAX_ADDRESS], holder.detail[:MAX_DETAIL]
        args = (key, owner, address, kind, detail, ttl_ms, permits)
        taken = pools.run(pools.ops.acquire_permit, args, timeout, renewal=False)
        if taken is None or isinstance(taken, PermitGrant):
            return taken
        return holder_of(taken)

    # Preempt requests (migration 0006): the lease row's ``preempt_token`` names the lease
    # asked; its owner's renewals answer PREEMPTED, each in the one statement (PostgreSQL: one
    # function call) that would have renewed it, the batch still one round trip.

    supports_preempt = True

    def preempt(self, key: str, *, timeout: float | None = None) -> int | None:
        pools = self._pools
        return pools.run(pools.ops.preempt, (key,), timeout, renewal=False)

    # Tick records (migration 0007): two nullable columns of the key's row, written by one
    # UPDATE of the owner's live plain lease (the renewals' liveness rule, on the database's
    # clock) and by no other statement, so a record outlives its lease and the acquires of
    # other owners; prune() deletes it with the row.

    supports_ticks = True

    def record_tick(
        self, key: str, owner: str, tick_ms: int, *, timeout: float | None = None
    ) -> bool:
        check_tick_ms(tick_ms)
        pools = self._pools
        return pools.run(pools.ops.record_tick, (key, owner, tick_ms), timeout, renewal=False)

    def recorded_tick(self, key: str, *, timeout: float | None = None) -> TickRecord | None:
        pools = self._pools
        row = pools.run(pools.ops.recorded_tick, (key,), timeout, renewal=False, write=False)
        return None if row is None else TickRecord(*row)

    # Optional capabilities.

    keeps_ended_leases = True  # one row per key, kept after release: the token floor

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        pools = self._pools
        rows = pools.run(pools.ops.leases, (include_inactive,), None, renewal=False, write=False)
        infos = [lease_info(row) for row in rows]
        return sorted(infos, key=lambda info: (info.state != "held", info.key))

    def lease(self, key: str, *, include_inactive: bool = False) -> LeaseInfo | None:
        pools = self._pools
        row = pools.run(pools.ops.lease, (key, include_inactive), None, renewal=False, write=False)
        return None if row is None else lease_info(row)

    def prune(self, older_than_ms: int, *, dry_run: bool = False, prefix: str = "") -> int:
        """Delete the rows of leases that ended more than ``older_than_ms`` ago (batches of
        ``PRUNE_BATCH`` on PostgreSQL, each its own transaction and call), each batch raising
        the token source to its tokens first while it keeps acquires out. ``prefix``: only the
        rows whose key starts with it (compared exactly), for a service's ``KEY_PREFIX``."""
        check_older_than(older_than_ms)
        if not isinstance(prefix, str):
            raise TypeError(f"`prefix` must be a str, got {prefix!r}")
        pools = self._pools
        if dry_run:
            args = (older_than_ms, prefix)
            return pools.run(pools.ops.count_prunable, args, None, renewal=False, write=False)
        total, more = 0, True
        while more:
            deleted, more = pools.run(
                pools.ops.prune, (older_than_ms, PRUNE_BATCH, prefix), None, renewal=False
            )
            total += deleted
        return total

    def clear(self) -> None:
        pools = self._pools
        pools.run(pools.ops.clear, (), None, renewal=False)

    def warp(self, delta_ms: int) -> None:
        pools = self._pools
        pools.run(pools.ops.warp, (delta_ms,), None, renewal=False)

    def force_release(self, key: str) -> bool:
        pools = self._pools
        return pools.run(pools.ops.force_end, (key, None), None, renewal=False) == 1

    def wait_for_release(self, key: str, timeout: float) -> bool:
        """PostgreSQL only, with ``listen_using`` set: woken by the ``NOTIFY`` of a release."""
        if self.listen_using is None or connections[self.using].vendor != "postgresql":
            raise NotImplementedError
        return self._listeners.get().wait(key, timeout)

    def _new_listener(self) -> Listener:
        assert self.listen_using is not None  # wait_for_release() checked
        return Listener(self.listen_using, self.timeout)

    @property
    def _listener(self) -> Listener | None:
        """This process's listener, if it made one."""
        return self._listeners.peek()

    # Life cycle and diagnostics.

    def close(self) -> None:
        self._pools.close()
        listener = self._listeners.take()
        if listener is not None:
            listener.close()

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[Any]:
        using = options.get("using", DEFAULT_DB_ALIAS)
        return configuration_messages(using) if isinstance(using, str) else []

    def check(self, *, databases: Iterable[str] | None = None, deploy: bool = False) -> list[Any]:
        return store_messages(self, databases=databases, deploy=deploy)
