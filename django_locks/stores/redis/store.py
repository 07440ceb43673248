"""``RedisStore``: leases in Redis (standalone or Cluster), one Lua script per operation."""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import redis.exceptions

from django_locks.clock import MAX_WAIT
from django_locks.durations import MAX_DURATION_MS, Duration
from django_locks.exceptions import StoreError, StoreTimeoutError
from django_locks.stores import runtime
from django_locks.stores.base import LeaseInfo, LockStore, check_older_than, holder_name
from django_locks.stores.redis import checks, options, scripts
from django_locks.stores.redis.cluster import Node, Topology
from django_locks.stores.redis.wire import Pool

logger = logging.getLogger("django_locks")

MAX_CALL_TIMEOUT = MAX_DURATION_MS / 1000
"""The longest bound of one call, in seconds (366 days): the longest a lock's call may take."""


class _Process:
    """The connections of one process (a ``ProcessLocal``: made afresh in a forked child, which
    never uses or closes the parent's): a pool per server and kind (lock calls, waits), and the
    Cluster's topology."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.pools: dict[tuple[str, Node | None], Pool] = {}
        self.topology: Topology | None = None
        self.lock = threading.Lock()

    def pool(self, kind: str, node: Node | None) -> Pool:
        with self.lock:
            pool = self.pools.get((kind, node))
            if pool is None:
                store = self.store
                kwargs = dict(store._connection_kwargs)
                if node is not None:
                    kwargs["host"], kwargs["port"] = node
                pool = self.pools[kind, node] = Pool(
                    options.where(kwargs, node),
                    kwargs,
                    store._options.connection_class,
                    store.socket_connect_timeout,
                    store.max_connections,
                )
            return pool

    def cluster(self) -> Topology:
        with self.lock:
            if self.topology is None:
                store = self.store
                self.topology = Topology(
                    store.url, store._options.extra, store.socket_connect_timeout
                )
            return self.topology

    def close(self) -> None:
        with self.lock:
            pools, self.pools = self.pools, {}
            topology, self.topology = self.topology, None
        for pool in pools.values():
            pool.close()
        if topology is not None:
            topology.close()


class RedisStore(LockStore):
    """Leases in Redis, each a hash next to a fencing counter under one hash tag.

    Options (``LOCKS["OPTIONS"]``): exactly one of ``url`` (a redis-py URL: ``redis://``,
    ``rediss://``, ``unix://``) or ``cache`` (an alias of ``CACHES`` using django-redis or Django's
    ``RedisCache``: its location and credentials are used, on connections of the store's own);
    ``prefix`` (keys are ``<prefix>:{<digest>}:lease`` and ``...:fence``); ``socket_timeout`` (a
    duration, the default bound of a call) and ``socket_connect_timeout`` (a duration, the bound
    of connecting); ``max_connections`` per server and process; ``cluster=True`` for Redis
    Cluster. Built without I/O; connects on first use; safe from any thread and across ``fork()``.
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
    ) -> None:
        parsed = options.parse(
            url=url,
            cache=cache,
            prefix=prefix,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            max_connections=max_connections,
            cluster=cluster,
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
        self._process: runtime.ProcessLocal[_Process] = runtime.ProcessLocal(lambda: _Process(self))
        # Per process: another thread may hold it at fork() time.
        self._waits_lock = runtime.ProcessLocal(threading.Lock)
        self._waits_down = False  # waits for release notices fail (logged once per outage)

    def __repr__(self) -> str:
        where = f"cache={self.cache!r}" if self.cache else f"url={options.redact(self.url)!r}"
        return f"<RedisStore {where} prefix={self.prefix!r}{' cluster' if self.cluster else ''}>"

    # The contract (see LockStore for every rule).

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        names = scripts.names(self.prefix, key)
        command = scripts.acquire_call(names, owner, ttl_ms, holder_name())
        reply = self._routed(names.lease, command, timeout, scripts.ACQUIRE)
        return None if reply is None else int(reply)

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> bool:
        names = scripts.names(self.prefix, key)
        command = scripts.renew_call(names, owner, ttl_ms)
        return bool(self._routed(names.lease, command, timeout, scripts.RENEW) == 1)

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> list[bool]:
        """One pipeline per server: the renew script once per lease (each one atomic), after a
        ``SCRIPT LOAD`` in the same round trip, so that a flushed script cannot fail the batch."""
        deadline = self._deadline(timeout)
        by_node: dict[Node | None, list[int]] = {}
        for index, (key, _, _) in enumerate(leases):
            node = self._node_for(scripts.names(self.prefix, key).lease, deadline)
            by_node.setdefault(node, []).append(index)
        results = [False] * len(leases)
        for node, indexes in by_node.items():
            commands = [scripts.script_load(scripts.RENEW)]
            for index in indexes:
                key, owner, ttl_ms = leases[index]
                commands.append(scripts.renew_call(scripts.names(self.prefix, key), owner, ttl_ms))
            replies = self._on_node(node, lambda pool, c=commands: pool.pipeline(c, deadline))
            for index, reply in zip(indexes, replies[1:], strict=True):
                if isinstance(reply, redis.exceptions.AskError):
                    # The key's slot moved (Cluster): this one goes on its own, redirected.
                    key, owner, ttl_ms = leases[index]
                    left = max(deadline - time.monotonic(), 0)
                    results[index] = self.renew(key, owner, ttl_ms, timeout=left)
                elif isinstance(reply, BaseException):
                    what = self._pool(node).what
                    raise runtime.translated(reply, what, timed_out=False) from reply
                else:
                    results[index] = reply == 1
        return results

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        names = scripts.names(self.prefix, key)
        command = scripts.release_call(names, owner)
        return bool(self._routed(names.lease, command, timeout, scripts.RELEASE) == 1)

    def wait_for_release(self, key: str, timeout: float) -> bool:
        """Block up to ``timeout`` seconds in BLPOP on the key's wake-up list.

        One release wakes one waiter. Waits use connections of their own (up to
        ``max_connections`` per server), so blocked waiters never hold up renewals; a waiter that
        finds them all busy waits for one until its timeout and returns ``False``.

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
        """Held leases only: Redis forgets a lease once it is released or expired."""
        found = []
        for name in self._scan_leases():
            row = self._routed(name, scripts.inspect_call(name), None, scripts.INSPECT)
            if row is not None:
                found.append(_lease_info(row))
        return sorted(found, key=lambda lease: lease.key)

    def lease(self, key: str, *, include_inactive: bool = False) -> LeaseInfo | None:
        """The key's held lease, read in one script call (one round trip); ``None`` when none
        holds it (Redis keeps no released or expired lease, whatever ``include_inactive``)."""
        lease = scripts.names(self.prefix, key).lease
        row = self._routed(lease, scripts.inspect_call(lease), None, scripts.INSPECT)
        if row is None:
            return None
        info = _lease_info(row)
        return info if info.key == key else None  # a digest collision: another key's lease

    def prune(self, older_than_ms: int, *, dry_run: bool = False) -> int:
        """Nothing to prune: Redis keeps no ended leases (an expired or released lease is
        deleted by the server). Returns 0, after checking ``older_than_ms`` as every store does."""
        check_older_than(older_than_ms)
        return 0

    def clear(self) -> None:
        for name in self._scan_leases():
            self._force_release(name)

    def force_release(self, key: str) -> bool:
        return self._force_release(scripts.names(self.prefix, key).lease)

    def warp(self, delta_ms: int) -> None:
        for name in self._scan_leases():
            self._routed(name, scripts.warp_call(name, delta_ms), None, scripts.WARP)

    def _force_release(self, lease: bytes) -> bool:
        command = scripts.force_release_call(lease)
        return bool(self._routed(lease, command, None, scripts.FORCE_RELEASE) == 1)

    def _scan_leases(self) -> Iterator[bytes]:
        # Each master lists its own keys; the calls on a key are routed (MOVED-safe) anyway.
        pattern = scripts.lease_pattern(self.prefix)
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

    # Routing and calls.

    def _keys(self, key: str) -> tuple[bytes, bytes]:
        names = scripts.names(self.prefix, key)
        return names.lease, names.fence

    def _deadline(self, timeout: float | None) -> float:
        if timeout is None:
            timeout = self.socket_timeout
        # Capped at the longest ttl: a deadline past about 300 years overflows time_t.
        return time.monotonic() + min(timeout, MAX_CALL_TIMEOUT)

    def _pool(self, node: Node | None, kind: str = "ops") -> Pool:
        process = self._process.get()
        pool = process.pools.get((kind, node))
        return pool if pool is not None else process.pool(kind, node)

    def _routed(
        self, name: bytes, command: bytes, timeout: float | None, script: scripts.Script
    ) -> Any:
        """``command`` (a ``script`` call on the key named ``name``) on the server serving it."""
        deadline = self._deadline(timeout)
        if not self.cluster:
            return self._pool(None).call(command, deadline, script)

        def send(node: Node, asking: bool) -> Any:
            def on(pool: Pool) -> Any:
                if asking:
                    return pool.asking(command, deadline, script)
                return pool.call(command, deadline, script)

            return self._on_node(node, on)

        return self._process.get().cluster().routed(name, deadline, send)

    def _wait_call(self, wakeup: bytes, command: bytes, deadline: float) -> Any:
        """A BLPOP on the server serving ``wakeup``, on a wait connection; on Redis Cluster it
        follows MOVED and ASK as every call does (a slot migrating must not end a waiter with
        a redirection it cannot read)."""
        if not self.cluster:
            return self._pool(None, "wait").call(command, deadline)

        def send(node: Node, asking: bool) -> Any:
            def on(pool: Pool) -> Any:
                return pool.asking(command, deadline) if asking else pool.call(command, deadline)

            return self._on_node(node, on, purpose="wait")

        return self._process.get().cluster().routed(wakeup, deadline, send)

    def _on_node(self, node: Node | None, call: Any, *, purpose: str = "ops") -> Any:
        """``call(pool)`` on ``node``'s pool for ``purpose`` (lock calls, or waits); a Cluster
        node that failed (not an error reply) has the topology discovered again before the
        next call."""
        try:
            return call(self._pool(node, purpose))
        except StoreError as exc:
            cause = exc.__cause__  # None: no free connection, the node did not fail
            if node is not None and cause and not isinstance(cause, redis.exceptions.ResponseError):
                self._process.get().cluster().failed()
            raise

    def _node_for(self, name: bytes, deadline: float) -> Node | None:
        if not self.cluster:
            return None
        return self._process.get().cluster().node_for(name, deadline)

    def _primaries(self, deadline: float) -> list[Node | None]:
        if not self.cluster:
            return [None]
        return list(self._process.get().cluster().primaries(deadline))


def _lease_info(row: list[Any]) -> LeaseInfo:
    """The inspect script's reply as a ``LeaseInfo``."""
    key, owner, holder, token, acquired_at, pttl = row
    return LeaseInfo(
        key=key.decode(),
        state="held",
        owner=owner.decode(),
        holder=holder.decode(),
        fencing_token=int(token),
        acquired_at=datetime.datetime.fromtimestamp(int(acquired_at) / 1000, tz=datetime.UTC),
        # PTTL is -1 only for a lease someone stripped of its expiry by hand.
        expires_in=datetime.timedelta(milliseconds=int(pttl)) if pttl >= 0 else None,
    )
