"""``RedisStore``: leases in Redis (standalone or Cluster), one Lua script per operation."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import redis.exceptions

from django_locks.clock import MAX_WAIT
from django_locks.durations import Duration
from django_locks.exceptions import PermitsMismatchError, StoreError, StoreTimeoutError
from django_locks.holders import Holder
from django_locks.keys import check_permits
from django_locks.policy import POLICY
from django_locks.stores import runtime
from django_locks.stores.base import (
    LeaseInfo,
    LeaveReason,
    LockStore,
    PermitGrant,
    ReleaseReason,
    Renewed,
    Slot,
    TickRecord,
    check_older_than,
    holder_name,
)
from django_locks.stores.redis import checks, options, replies, scripts
from django_locks.stores.redis import scripts_permits as permit_scripts
from django_locks.stores.redis import scripts_preempt as preempt_scripts
from django_locks.stores.redis import scripts_ticks as tick_scripts
from django_locks.stores.redis.cluster import Node
from django_locks.stores.redis.replicas import Replicated
from django_locks.stores.redis.wire import Connections
from django_locks.stores.ticks import check_tick_ms

logger = logging.getLogger("django_locks")


class RedisStore(Replicated, LockStore):
    """Leases in Redis, each a hash next to a fencing counter under one hash tag.

    Options (``LOCKS["OPTIONS"]``): exactly one of ``url`` (a redis-py URL: ``redis://``,
    ``rediss://``, ``unix://``) or ``cache`` (an alias of ``CACHES`` using django-redis or Django's
    ``RedisCache``: its location and credentials are used, on connections of the store's own);
    ``prefix`` (keys are ``<prefix>:{<digest>}:lease`` and ``...:fence``); ``socket_timeout`` (a
    duration, the default bound of a call) and ``socket_connect_timeout`` (a duration, the bound
    of connecting); ``max_connections`` per server and process; ``cluster=True`` for Redis
    Cluster; ``sentinels`` and ``service_name``; ``min_replicas`` and ``replica_timeout``
    (``replicas.py``). Built without I/O; connects on first use; safe from any thread and
    across ``fork()``.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        cache: str | None = None,
        prefix: str = "django_locks",
        socket_timeout: Duration = 5,
        socket_connect_timeout: Duration = 2,
        max_connections: int = 50,
        cluster: bool = False,
        min_replicas: int = 0,
        replica_timeout: Duration = 0.1,
        sentinels: Sequence[str | tuple[str, int]] | None = None,
        service_name: str | None = None,
    ) -> None:
        parsed = options.parse(
            url=url,
            cache=cache,
            prefix=prefix,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            max_connections=max_connections,
            cluster=cluster,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
            sentinels=sentinels,
            service_name=service_name,
        )
        self.url = parsed.url
        self.cache = parsed.cache
        self.prefix = parsed.prefix
        self.socket_timeout = parsed.socket_timeout
        self.socket_connect_timeout = parsed.socket_connect_timeout
        self.max_connections = parsed.max_connections
        self.cluster = parsed.cluster
        self._options = parsed
        self._connection_kwargs = parsed.connection_kwargs
        self._process = runtime.ProcessLocal(lambda: Connections(parsed))
        # Per process: another thread may hold it at fork() time.
        self._waits_lock = runtime.ProcessLocal(threading.Lock)
        self._waits_down = False  # waits for release notices fail (logged once per outage)

    def __repr__(self) -> str:
        where = f"cache={self.cache!r}" if self.cache else f"url={options.redact(self.url)!r}"
        if self.sentinels:
            where += f" service_name={self.service_name!r}"
        return f"<RedisStore {where} prefix={self.prefix!r}{' cluster' if self.cluster else ''}>"

    def __str__(self) -> str:
        """``Redis 127.0.0.1:6379/0``, ``Redis Cluster 10.0.0.5:7000``, with the cache alias
        it borrows from (``(cache "locks")``); never the password."""
        return options.label(self._options)

    # The contract (see LockStore for every rule).

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        """:meth:`acquire_as` describing the holder as this process (``host:pid``, kind
        ``process``). The service calls :meth:`acquire_as`."""
        taken = self.acquire_as(key, owner, ttl_ms, Holder.parse(holder_name()), timeout=timeout)
        return taken if type(taken) is int else None

    describes_holders = True
    """The holder's description lives in the lease's hash, and a failed acquire answers with
    it. How a lease ended is not kept: Redis deletes a lease as it ends (``keeps_ended_leases``
    is False), so :meth:`end`, :meth:`leave` and :meth:`force_end` have nowhere to record it."""

    def acquire_as(
        self, key: str, owner: str, ttl_ms: int, holder: Holder, *, timeout: float | None = None
    ) -> int | Holder | None:
        """One script call: the token, or the holder of the key (its ``expires_at`` from its
        PTTL and the server's TIME, read in the same script); ``PermitsMismatchError`` from the
        same reply for a key held by permits or a live slot's key (``"k#2"``: ``_slot_named``)."""
        names = scripts.names(self.prefix, key)
        deadline = self._deadline(timeout)
        slot = self._slot_named(key, 1, deadline)
        command = scripts.acquire_as_call(names, owner, ttl_ms, holder, slot)
        reply, confirmed = self._replicated(names.lease, command, deadline, scripts.ACQUIRE_AS)
        taken = replies.taken(key, 1, reply)
        assert not isinstance(taken, PermitGrant)  # a plain acquire is granted no permit
        if type(taken) is int:
            self._require_replicas(key, owner, confirmed, deadline)
        return taken

    supports_permits = True
    """A key's slots and its own record live under the key's hash tag (``scripts_permits``)."""

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
        """One script call (see :meth:`LockStore.acquire_permit`): the grant, the holder of
        the slot ending first, or ``PermitsMismatchError``, all from its reply."""
        if check_permits(permits) < 2:
            raise ValueError(f"`permits` of acquire_permit() must be 2 or more, got {permits!r}")
        names = scripts.names(self.prefix, key)
        deadline = self._deadline(timeout)
        slot = self._slot_named(key, permits, deadline)
        command = permit_scripts.acquire_permit_call(names, owner, ttl_ms, permits, holder, slot)
        reply, confirmed = self._replicated(
            names.lease, command, deadline, permit_scripts.ACQUIRE_PERMIT
        )
        taken = replies.taken(key, permits, reply)
        assert not isinstance(taken, int)  # the permits script answers a grant, not a token
        if isinstance(taken, PermitGrant):
            self._require_replicas(Slot(key, taken.permit), owner, confirmed, deadline)
        return taken

    def _slot_named(self, key: str, permits: int, deadline: float) -> bytes | None:
        """For a key shaped like a slot's (``"k#2"``), the lease of that slot of ``k``, for the
        acquire's script to check on a lone server. On Redis Cluster (another hash slot) it is
        read here, in a call before the acquire's, raising ``PermitsMismatchError`` if live."""
        shaped = permit_scripts.shaped_slot(self.prefix, key)
        if shaped is None or not self.cluster:
            return None if shaped is None else shaped[0]
        slot = shaped[0]
        row = self._routed(
            slot, scripts.describe_call(slot), self._left(deadline), scripts.DESCRIBE
        )
        if row is not None and row[0] == key.encode():
            raise PermitsMismatchError(key, permits, int(row[9]) if permits == 1 else 1)
        return None

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        """One script call: renewed, refused, or ``PREEMPTED`` (not extended) for a lease
        carrying a preempt request naming its token (:meth:`preempt`)."""
        name, command = self._renew_call(key, owner, ttl_ms)
        deadline = self._deadline(timeout)
        reply, confirmed = self._replicated(name, command, deadline, scripts.RENEW_RECORDED)
        renewed = replies.renewed(reply)
        if renewed is True:
            self._renewals_confirmed(confirmed, 1)
        return renewed

    def _renew_call(self, key: str, owner: str, ttl_ms: int) -> tuple[bytes, bytes]:
        """The lease renewed (a ``Slot``'s under its base key's hash tag) and its call."""
        if isinstance(key, Slot):
            slot, base = permit_scripts.slot_names(self.prefix, key.base, key.permit)
            return slot, scripts.renew_slot_call(slot, base, owner, ttl_ms)
        names = scripts.names(self.prefix, key)
        return names.lease, scripts.renew_call(names, owner, ttl_ms)

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> list[Renewed]:
        """One pipeline per server: the renew script once per lease (each one atomic; a
        ``Slot``'s moving its key's record along; each answering as :meth:`renew` does), after a
        ``SCRIPT LOAD`` in the same round trip, so that a flushed script cannot fail the batch."""
        deadline = self._deadline(timeout)
        calls = [self._renew_call(key, owner, ttl_ms) for key, owner, ttl_ms in leases]
        by_node: dict[Node | None, list[int]] = {}
        for index, (name, _) in enumerate(calls):
            by_node.setdefault(self._node_for(name, deadline), []).append(index)
        results: list[Renewed] = [False] * len(leases)
        for node, indexes in by_node.items():
            commands = [scripts.script_load(scripts.RENEW_RECORDED)]
            commands += [calls[index][1] for index in indexes]
            if self.min_replicas:  # a lone master: WAIT after the scripts, in the same write
                commands.append(self._wait_command())
            answers = self._on_node(node, lambda pool, c=commands: pool.pipeline(c, deadline))
            if self.min_replicas:
                self._renewals_confirmed(answers.pop(), len(indexes))
            for index, reply in zip(indexes, answers[1:], strict=True):
                if isinstance(reply, redis.exceptions.AskError):
                    # The key's slot moved (Cluster): this one goes on its own, redirected.
                    key, owner, ttl_ms = leases[index]
                    results[index] = self.renew(key, owner, ttl_ms, timeout=self._left(deadline))
                elif isinstance(reply, BaseException):
                    what = self._pool(node).what
                    raise runtime.translated(reply, what, timed_out=False) from reply
                else:
                    results[index] = replies.renewed(reply)
        return results

    supports_preempt = True
    """A preempt request is a field of the lease it asks (a plain lease, or a slot under
    permits), so it expires and is deleted with that lease (``scripts_preempt``)."""

    def preempt(self, key: str, *, timeout: float | None = None) -> int | None:
        """One script call on the key's lease: the request written on it (under permits, on
        its live slot with the lowest token) and that lease's token, or ``None``."""
        names = scripts.names(self.prefix, key)
        command = preempt_scripts.preempt_call(names)
        reply = self._routed(names.lease, command, timeout, preempt_scripts.PREEMPT)
        return None if reply is None else int(reply)

    supports_ticks = True
    """A key's tick record is a string next to its lease under the same hash tag, with no
    expiry, which no script of a lease touches (``scripts_ticks``)."""

    def record_tick(
        self, key: str, owner: str, tick_ms: int, *, timeout: float | None = None
    ) -> bool:
        """One script call: the owner's live plain lease found and its token recorded with
        ``tick_ms`` in the same step."""
        check_tick_ms(tick_ms)
        names = scripts.names(self.prefix, key)
        command = tick_scripts.record_tick_call(names, owner, tick_ms)
        return bool(self._routed(names.lease, command, timeout, tick_scripts.RECORD_TICK) == 1)

    def recorded_tick(self, key: str, *, timeout: float | None = None) -> TickRecord | None:
        """One GET of the key's record."""
        names = scripts.names(self.prefix, key)
        reply = self._routed(names.tick, tick_scripts.recorded_tick_call(names), timeout, None)
        return tick_scripts.tick_record(reply, names.tick)

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        if isinstance(key, Slot):
            slot, base = permit_scripts.slot_names(self.prefix, key.base, key.permit)
            command = permit_scripts.release_permit_call(slot, base, owner)
            return bool(self._routed(slot, command, timeout, permit_scripts.RELEASE_PERMIT) == 1)
        names = scripts.names(self.prefix, key)
        command = scripts.release_call(names, owner)
        return bool(self._routed(names.lease, command, timeout, scripts.RELEASE) == 1)

    def end(
        self, key: str, owner: str, how: ReleaseReason, *, timeout: float | None = None
    ) -> bool:
        """:meth:`release`: the lease is deleted, ``how`` with it (nothing lists an ended
        lease on Redis)."""
        return self.release(key, owner, timeout=timeout)

    def leave(
        self, key: str, owner: str, ttl_ms: int, how: LeaveReason, *, timeout: float | None = None
    ) -> bool:
        """:meth:`renew` to ``ttl_ms``, not recorded as a renewal, whatever preempt request the
        lease carries (the holder's last word: ``True`` or ``False``); ``how`` (any
        :data:`LeaveReason`, ``"max hold"`` too) is not kept: the lease is listed as held until
        it expires, then not at all."""
        if isinstance(key, Slot):
            slot, base = permit_scripts.slot_names(self.prefix, key.base, key.permit)
            command = permit_scripts.leave_permit_call(slot, base, owner, ttl_ms)
            return bool(self._routed(slot, command, timeout, permit_scripts.LEAVE_PERMIT) == 1)
        names = scripts.names(self.prefix, key)
        command = scripts.leave_call(names, owner, ttl_ms)
        return bool(self._routed(names.lease, command, timeout, scripts.RENEW) == 1)

    def wait_for_release(self, key: str, timeout: float) -> bool:
        """Block up to ``timeout`` seconds in BLPOP on the key's wake-up list (then, not woken,
        ``POLICY.head_start()`` more). One release wakes one waiter. Waits use connections of
        their own (up to ``max_connections`` per server), so blocked waiters never hold up
        renewals; a waiter that finds them all busy waits until its timeout: ``False``.

        A waiter outlives its connection: when the connection it blocks on fails (``CLIENT
        KILL``, a proxy, a restart) it waits again on a fresh one; when that fails too, it sleeps
        out ``timeout`` and returns ``False`` (the caller tries ``acquire`` at its backoff, and
        that call says whether the server answers). Never raises ``StoreError``.
        """
        wakeup = scripts.names(self.prefix, key).released
        # One wait of at most MAX_WAIT (a longer one returns False then: callers wait again).
        give_up = time.monotonic() + min(max(timeout, 0), MAX_WAIT)
        for attempt in range(2):
            left = give_up - time.monotonic()
            # The server ends the BLPOP at the timeout; the call gets a second more to say so.
            deadline = time.monotonic() + max(left, 0) + 1
            try:
                command = scripts.pack("BLPOP", wakeup, max(left, 0.001))
                reply = self._wait_call(wakeup, command, deadline)
            except StoreError as exc:
                if isinstance(exc, StoreTimeoutError) and time.monotonic() >= give_up:
                    return False  # no free wait connection (or no answer) before the timeout
                if attempt == 0 and give_up - time.monotonic() > 0.001:
                    continue  # the connection was killed: a fresh one
                self._waits_failing(exc)
                time.sleep(max(give_up - time.monotonic(), 0))
                return False
            self._waits_work()
            if reply is None:  # ended on the server's tick, with others' (see the policy)
                time.sleep(POLICY.head_start())
            return reply is not None
        return False  # not reached

    def _waits_failing(self, exc: BaseException) -> None:
        with self._waits_lock.get():
            first, self._waits_down = not self._waits_down, True
        if first:
            logger.warning(
                "Waiting for release notices on Redis failed (%s): waiters sleep through their "
                "backoff until a wait succeeds again",
                exc,
            )

    def _waits_work(self) -> None:
        if self._waits_down:
            with self._waits_lock.get():
                self._waits_down = False
            logger.info("Waiting for release notices on Redis works again")

    # Listing, operators' and testing aids.

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        """Held leases only (each slot of a key taken with permits, and its record): Redis
        forgets a lease once it is released or expired."""
        found = []
        for name in self._scan_leases(slots=True):
            row = self._routed(name, scripts.describe_call(name), None, scripts.DESCRIBE)
            if row is not None:
                found.append(replies.lease_info(row))
        return sorted(found, key=lambda lease: lease.key)

    def lease(self, key: str, *, include_inactive: bool = False) -> LeaseInfo | None:
        """The key's held lease, read in one script call (one round trip; a key shaped like a
        slot's, ``"k#2"``, not held plainly: one more, for the slot); ``None`` when none holds
        it (Redis keeps no released or expired lease, whatever ``include_inactive``)."""
        lease = scripts.names(self.prefix, key).lease
        row = self._routed(lease, scripts.describe_call(lease), None, scripts.DESCRIBE)
        if row is None and (shaped := permit_scripts.shaped_slot(self.prefix, key)) is not None:
            lease = shaped[0]
            row = self._routed(lease, scripts.describe_call(lease), None, scripts.DESCRIBE)
        if row is None:
            return None
        info = replies.lease_info(row)
        return info if info.key == key else None  # a digest collision: another key's lease

    def prune(self, older_than_ms: int, *, dry_run: bool = False) -> int:
        """Nothing to prune: Redis keeps no ended leases (an expired or released lease is
        deleted by the server). Returns 0, after checking ``older_than_ms`` as every store does."""
        check_older_than(older_than_ms)
        return 0

    def clear(self) -> None:
        """Frees every lease under the prefix (keeping the counters) and deletes every tick
        record."""
        for name in self._scan_leases():
            self._force_release(name)
        for name in self._scan(tick_scripts.tick_pattern(self.prefix)):
            self._routed(name, scripts.pack("DEL", name), None, None)

    def force_release(self, key: str) -> bool:
        """Frees the key's plain lease, or its record and every slot of it; a slot's key
        (``"k#2"``) frees that slot, the record following as for :meth:`end`."""
        shaped = permit_scripts.shaped_slot(self.prefix, key)
        if shaped is not None:
            slot, base = shaped
            command = permit_scripts.force_release_slot_call(slot, base, key)
            if self._routed(slot, command, None, permit_scripts.FORCE_RELEASE_SLOT) == 1:
                return True
        return self._force_release(scripts.names(self.prefix, key).lease)

    def force_end(self, key: str, by: str) -> bool:
        """:meth:`force_release`; ``by`` is not kept (the lease is deleted): the admin's log and
        ``locks release``'s warning name who released it."""
        return self.force_release(key)

    def warp(self, delta_ms: int) -> None:
        for name in self._scan_leases():
            self._routed(name, scripts.warp_call(name, delta_ms), None, scripts.WARP)

    def _force_release(self, lease: bytes) -> bool:
        command = permit_scripts.force_end_call(lease, *scripts.siblings(lease))
        return bool(self._routed(lease, command, None, permit_scripts.FORCE_END) == 1)

    def _scan_leases(self, *, slots: bool = False) -> Iterator[bytes]:
        return self._scan(scripts.lease_pattern(self.prefix, slots=slots))

    def _scan(self, pattern: str) -> Iterator[bytes]:
        # Each master lists its own keys; the calls on a key are routed (MOVED-safe) anyway.
        for node in self._primaries(self._deadline(None)):
            cursor: bytes | int = b"0"
            while True:
                command = scripts.pack("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                cursor, names = self._on_node(
                    node, lambda pool, c=command: pool.call(c, self._deadline(None))
                )
                yield from names
                if cursor in (b"0", 0):
                    break

    # Life cycle and diagnostics.

    def close(self) -> None:
        process = self._process.peek()
        if process is not None:
            process.close()

    def check(self, *, databases: Iterable[str] | None = None, deploy: bool = False) -> list[Any]:
        """Warnings about the server's persistence and eviction (``--deploy`` / ``--database``)."""
        if not deploy and not databases:
            return []
        return checks.check_store(self)

    # Key names (the calls go through wire.Calls).

    def _keys(self, key: str) -> tuple[bytes, bytes]:
        names = scripts.names(self.prefix, key)
        return names.lease, names.fence
