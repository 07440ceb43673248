"""``RedisStore``: leases in Redis (standalone or Cluster), one Lua script per operation."""

from __future__ import annotations

import datetime
import functools
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_locks.clock import MAX_WAIT
from django_locks.durations import MAX_DURATION_MS, Duration, timeout_seconds
from django_locks.exceptions import StoreError, StoreTimeoutError
from django_locks.stores.base import LeaseInfo, LockStore, holder_name

try:
    import redis
    import redis.cluster
    import redis.exceptions
    from redis.backoff import NoBackoff
    from redis.connection import Connection, parse_url
    from redis.crc import key_slot
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImproperlyConfigured(
        "django_locks.stores.RedisStore needs redis-py: "
        "pip install 'django-distributed-locks[redis]'."
    ) from exc

from django_locks.stores.redis_connections import Pool, bulk, pack, remaining, verb

logger = logging.getLogger("django_locks")

# Every script below is atomic because Redis runs a script to completion before it serves any
# other command: the ownership check and the write it guards are one step, never a read followed
# by a write from the client. Each script touches only KEYS that share one hash tag, hence one
# Cluster slot. Expiry is PEXPIRE in milliseconds on the server's clock.
#
# KEYS[1] is the lease, a hash {key, owner, holder, token, acquired_at}; KEYS[2] is the key's
# fencing counter, a string that never expires and only grows.

# A free key gets token max(counter + 1, server TIME in microseconds): the counter keeps tokens
# growing when the clock does not, the TIME floor keeps them growing when the counter was lost
# (a crash before the last writes reached the disk, an eviction, a FLUSHALL). Lua numbers are
# doubles, exact up to 2^53 (TIME in microseconds gets there in the year 2255): a token beyond
# is refused, never rounded. string.format('%d') keeps all 16 digits where tostring would print
# 1.7e+15. The same owner gets its token back and its lease extended, so a retry after a
# timeout never strands the lease.
ACQUIRE_SCRIPT = """
local holder = redis.call('HGET', KEYS[1], 'owner')
if holder then
  if holder ~= ARGV[1] then
    return false
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'token'))
end
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local token = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
if token < now_us then
  token = now_us
end
if token > 9007199254740991 then
  return redis.error_reply('django_locks: fencing token beyond 2^53 - 1, Lua numbers lose digits')
end
local token_s = string.format('%d', token)
redis.call('SET', KEYS[2], token_s)
redis.call('HSET', KEYS[1], 'key', ARGV[4], 'owner', ARGV[1], 'holder', ARGV[3],
  'token', token_s, 'acquired_at', string.format('%d', math.floor(now_us / 1000)))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
"""

# Ownership is checked and the expiry moved in one step; an expired lease no longer exists for
# Redis, so it is never revived.
RENEW_SCRIPT = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# Ownership is checked and the lease deleted in one step; the counter (KEYS[2]) is untouched.
# KEYS[3] is the key's wake-up list: one element wakes one waiter blocked in BLPOP (one is all
# a handover needs); it lapses after a second when nobody waits.
_WAKE_ONE = """
  redis.call('DEL', KEYS[3])
  redis.call('RPUSH', KEYS[3], '1')
  redis.call('PEXPIRE', KEYS[3], 1000)
"""
RELEASE_SCRIPT = f"""
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
{_WAKE_ONE}
  return 1
end
return 0
"""
# An operator's release (or the testing reset): whoever holds it, waking a waiter the same way.
FORCE_RELEASE_SCRIPT = f"""
if redis.call('DEL', KEYS[1]) == 1 then
{_WAKE_ONE}
  return 1
end
return 0
"""

# Reads the lease and its remaining time in one step, so the listing never pairs one holder's
# fields with the next holder's expiry.
INSPECT_SCRIPT = """
local lease = redis.call('HMGET', KEYS[1], 'key', 'owner', 'holder', 'token', 'acquired_at')
if not lease[2] then
  return false
end
lease[6] = redis.call('PTTL', KEYS[1])
return lease
"""

# Testing aid (LockStore.warp): the lease's remaining time shortened by ARGV[1] ms in one step;
# a lease with no time left is deleted as its expiry would delete it (no wake-up, counter kept).
WARP_SCRIPT = """
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  return 0
end
left = left - tonumber(ARGV[1])
if left <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], left)
end
return 1
"""

_SCRIPTS = {
    name: (body, hashlib.sha1(body.encode()).hexdigest())
    for name, body in {
        "acquire": ACQUIRE_SCRIPT,
        "renew": RENEW_SCRIPT,
        "release": RELEASE_SCRIPT,
        "force_release": FORCE_RELEASE_SCRIPT,
        "inspect": INSPECT_SCRIPT,
        "warp": WARP_SCRIPT,
    }.items()
}

_CACHE_BACKENDS = ("django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache")
# Options of the cache that are ours to decide (timeouts, pool size) or meaningless to a
# redis-py connection; the rest (db, username, password, ssl_*) are taken as they are.
_CACHE_IGNORED = {"pool_class", "parser_class", "socket_timeout", "socket_connect_timeout"}
_CACHE_IGNORED |= {"max_connections", "retry", "retry_on_timeout", "health_check_interval"}
_CHECK_TIMEOUT = 2.0
_MAX_REDIRECTS = 3
MAX_CALL_TIMEOUT = MAX_DURATION_MS / 1000
"""The longest bound of one call, in seconds (366 days): the longest a lock's call may take."""


class _Process:
    """The connections of one process: rebuilt after ``fork()``, never shared with the parent."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.pools: dict[tuple[str, tuple[str, int] | None], Pool] = {}
        self.cluster: redis.cluster.RedisCluster | None = None
        self.moved: dict[int, tuple[str, int]] = {}
        self.refresh = False
        self.lock = threading.Lock()


class RedisStore(LockStore):
    """Leases in Redis, each a hash next to a fencing counter under one hash tag.

    Options (``LOCKS["OPTIONS"]``): exactly one of ``url`` (a redis-py URL: ``redis://``,
    ``rediss://``, ``unix://``) or ``cache`` (an alias of ``CACHES`` using django-redis or Django's
    ``RedisCache``: its location and credentials are used, on connections of the store's own);
    ``prefix`` (keys are ``<prefix>:{<digest>}:lease`` and ``...:fence``); ``socket_timeout`` and
    ``socket_connect_timeout`` (durations, the default bound of a call); ``max_connections`` per
    server and process; ``cluster=True`` for Redis Cluster. Built without I/O; connects on first
    use; safe from any thread and across ``fork()``.
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
        if (url is None) == (cache is None):
            raise ImproperlyConfigured(
                "RedisStore needs exactly one of the options 'url' (a Redis URL such as "
                "'redis://localhost:6379/0') or 'cache' (an alias of a Redis cache in CACHES)."
            )
        if not isinstance(prefix, str) or not prefix or {"{", "}"} & set(prefix):
            raise ImproperlyConfigured(
                f"RedisStore option 'prefix' must be a non-empty string without braces, got "
                f"{prefix!r}: set it to a name such as 'myproject_locks'."
            )
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise ImproperlyConfigured(
                f"RedisStore option 'max_connections' must be an int, got {max_connections!r}."
            )
        if max_connections < 1:
            raise ImproperlyConfigured(
                f"RedisStore option 'max_connections' must be at least 1, got {max_connections}."
            )
        if not isinstance(cluster, bool):
            raise ImproperlyConfigured(
                f"RedisStore option 'cluster' must be a bool, got {cluster!r}."
            )
        try:
            self.socket_timeout = timeout_seconds(socket_timeout, name="socket_timeout")
            self.socket_connect_timeout = timeout_seconds(
                socket_connect_timeout, name="socket_connect_timeout"
            )
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"RedisStore option {exc}") from exc
        if cache is not None:
            url, extra = _from_cache(cache)
        else:
            extra = {}
        if not isinstance(url, str):
            raise ImproperlyConfigured(f"RedisStore option 'url' must be a string, got {url!r}.")
        try:
            # The URL wins over the cache's options, as in redis-py's from_url.
            options = {**extra, **parse_url(url)}  # type: ignore[no-untyped-call]
        except (ValueError, TypeError) as exc:
            raise ImproperlyConfigured(
                f"RedisStore option 'url' is not a Redis URL ({exc}): use "
                "'redis://[[username]:password@]host:port/db', 'rediss://...' or 'unix://path'."
            ) from exc
        self.url = url
        self.cache = cache
        self.prefix = prefix
        self.max_connections = max_connections
        self.cluster = cluster
        self._extra = extra
        options.pop("max_connections", None)  # the store's own option, not the URL's
        self._connection_class: type[Any] = options.pop("connection_class", Connection)
        self._connection_kwargs = {
            **options,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            # One attempt per call: retrying is the caller's decision, within its deadline.
            "retry": Retry(NoBackoff(), 0),
            # The store reads its own replies (redis_connections) in RESP2, where the server sends
            # nothing but the replies to what was asked (no RESP3 push messages).
            "protocol": 2,
        }
        self._process: _Process | None = None
        self._process_lock = threading.Lock()
        self._waits_down = False  # waits for release notices fail (logged once per outage)

    def __repr__(self) -> str:
        where = f"cache={self.cache!r}" if self.cache else f"url={_redact(self.url)!r}"
        return f"<RedisStore {where} prefix={self.prefix!r}{' cluster' if self.cluster else ''}>"

    # The contract (see LockStore for every rule).

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        names = _names(self.prefix, key)
        command = b"".join(
            (
                _CALLS["acquire"],
                names.packed_keys[2],
                bulk(owner.encode()),
                bulk(b"%d" % ttl_ms),
                _bulk_text(holder_name()),
                names.packed_key,
            )
        )
        result = self._routed(names.lease, command, timeout, "acquire")
        return None if result is None else int(result)

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> bool:
        name, command = self._renewal(key, owner, ttl_ms)
        return bool(self._routed(name, command, timeout, "renew") == 1)

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> list[bool]:
        """One pipeline per server: the renew script once per lease (each one atomic), after a
        ``SCRIPT LOAD`` in the same round trip, so that a flushed script cannot fail the batch."""
        deadline = self._deadline(timeout)
        by_node: dict[tuple[str, int] | None, list[int]] = {}
        for index, (key, _, _) in enumerate(leases):
            by_node.setdefault(self._node_for(self._keys(key)[0], deadline), []).append(index)
        results = [False] * len(leases)
        for node, indexes in by_node.items():
            commands = [pack(("SCRIPT", "LOAD", RENEW_SCRIPT))]
            commands += [self._renewal(*leases[index])[1] for index in indexes]
            replies = self._pipeline(node, commands, deadline)
            for index, reply in zip(indexes, replies[1:], strict=True):
                if isinstance(reply, redis.exceptions.AskError):
                    # The key's slot moved (Cluster): this one goes on its own, redirected.
                    key, owner, ttl_ms = leases[index]
                    results[index] = self.renew(key, owner, ttl_ms, timeout=remaining(deadline))
                elif isinstance(reply, BaseException):
                    raise _translate(reply, "renewing leases")
                else:
                    results[index] = reply == 1
        return results

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        names = _names(self.prefix, key)
        command = _CALLS["release"] + names.packed_keys[3] + bulk(owner.encode())
        return bool(self._routed(names.lease, command, timeout, "release") == 1)

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
        wakeup = self._wakeup_key(key)
        # One wait of at most MAX_WAIT (a longer one returns False then: callers wait again).
        give_up = time.monotonic() + min(max(timeout, 0), MAX_WAIT)
        for attempt in range(2):
            left = give_up - time.monotonic()
            # The server ends the BLPOP at the timeout; the socket gets a second more to say so.
            deadline = time.monotonic() + max(left, 0) + 1
            try:
                node = self._node_for(wakeup, deadline)
                command = pack(("BLPOP", wakeup, max(left, 0.001)))
                reply = self._call(node, command, deadline, pool="wait")
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
        with self._process_lock:
            first, self._waits_down = not self._waits_down, True
        if first:
            logger.warning(
                "Waiting for release notices on Redis failed (%s): waiters sleep through their "
                "backoff until a wait succeeds again",
                exc,
            )

    def _waits_work(self) -> None:
        if self._waits_down:
            with self._process_lock:
                self._waits_down = False
            logger.info("Waiting for release notices on Redis works again")

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        """Held leases only: Redis forgets a lease once it is released or expired."""
        found = []
        for name in self._scan_leases():
            command = pack(("EVALSHA", _SCRIPTS["inspect"][1], 1, name))
            row = self._routed(name, command, None, "inspect")
            if row is None:
                continue
            key, owner, holder, token, acquired_at, pttl = row
            found.append(
                LeaseInfo(
                    key=key.decode(),
                    state="held",
                    owner=owner.decode(),
                    holder=holder.decode(),
                    fencing_token=int(token),
                    acquired_at=datetime.datetime.fromtimestamp(
                        int(acquired_at) / 1000, tz=datetime.UTC
                    ),
                    # PTTL is -1 only for a lease someone stripped of its expiry by hand.
                    expires_in=datetime.timedelta(milliseconds=int(pttl)) if pttl >= 0 else None,
                )
            )
        return sorted(found, key=lambda lease: lease.key)

    def clear(self) -> None:
        for name in self._scan_leases():
            self._force_release(name)

    def force_release(self, key: str) -> bool:
        return self._force_release(self._keys(key)[0])

    def warp(self, delta_ms: int) -> None:
        sha = _SCRIPTS["warp"][1]
        for name in self._scan_leases():
            self._routed(name, pack(("EVALSHA", sha, 1, name, int(delta_ms))), None, "warp")

    def _force_release(self, lease: bytes) -> bool:
        base = lease[: -len(b"lease")]
        sha = _SCRIPTS["force_release"][1]
        command = pack(("EVALSHA", sha, 3, lease, base + b"fence", base + b"released"))
        reply = self._routed(lease, command, None, "force_release")
        return bool(reply == 1)

    def close(self) -> None:
        with self._process_lock:
            process, self._process = self._process, None
        if process is not None and process.pid == os.getpid():
            for pool in process.pools.values():
                pool.close()
            if process.cluster is not None:
                process.cluster.close()

    def check(self, *, databases: Iterable[str] | None = None, deploy: bool = False) -> list[Any]:
        """Warnings about the server's persistence and eviction (``--deploy`` / ``--database``)."""
        if not deploy and not databases:
            return []
        try:
            nodes = self._primaries(time.monotonic() + _CHECK_TIMEOUT)
            found: list[Any] = []
            for node in nodes:
                found += self._check_node(node)
            return found
        except StoreError as exc:
            return [
                checks.Warning(
                    f"django_locks could not reach Redis at {_redact(self.url)} to check its "
                    f"persistence and eviction settings: {exc.__cause__ or exc}",
                    hint="Start the server or fix LOCKS['OPTIONS'], then run the check again.",
                    id="django_locks.W206",
                )
            ]

    # Keys and routing.

    def _keys(self, key: str) -> tuple[bytes, bytes]:
        names = _names(self.prefix, key)
        return names.lease, names.fence

    def _wakeup_key(self, key: str) -> bytes:
        return _names(self.prefix, key).released

    def _renewal(self, key: str, owner: str, ttl_ms: int) -> tuple[bytes, bytes]:
        """The lease's name and the renew script's call for it."""
        names = _names(self.prefix, key)
        owner_ttl = bulk(owner.encode()) + bulk(b"%d" % ttl_ms)
        return names.lease, _CALLS["renew"] + names.packed_keys[2] + owner_ttl

    def _routed(
        self,
        name: bytes,
        command: bytes,
        timeout: float | None,
        script: str | None = None,
    ) -> Any:
        deadline = self._deadline(timeout)
        node = self._node_for(name, deadline)
        for _ in range(_MAX_REDIRECTS):
            try:
                return self._call(node, command, deadline, script)
            except redis.exceptions.AskError as exc:
                # MovedError is an AskError; a real ASK (slot migrating) is not remembered.
                if isinstance(exc, redis.exceptions.MovedError):
                    self._state().moved[exc.slot_id] = (exc.host, exc.port)
                node = (exc.host, exc.port)
        raise StoreError(f"Redis Cluster redirected {name!r} more than {_MAX_REDIRECTS} times.")

    def _node_for(self, name: bytes, deadline: float) -> tuple[str, int] | None:
        if not self.cluster:
            return None
        process = self._state()
        cluster = self._cluster(process, deadline)
        slot = key_slot(name)
        if slot in process.moved:
            return process.moved[slot]
        try:
            node = cluster.nodes_manager.slots_cache[slot][0]
        except (KeyError, IndexError) as exc:
            raise StoreError(f"No Redis Cluster node serves slot {slot}.") from exc
        return (node.host, node.port)

    def _primaries(self, deadline: float) -> list[tuple[str, int] | None]:
        if not self.cluster:
            return [None]
        cluster = self._cluster(self._state(), deadline)
        return [(node.host, node.port) for node in cluster.get_primaries()]  # type: ignore[no-untyped-call]

    def _scan_leases(self) -> Iterator[bytes]:
        # Each master lists its own keys; the calls on a key are routed (MOVED-safe) anyway.
        pattern = _glob_escape(self.prefix) + ":{*}:lease"
        for node in self._primaries(self._deadline(None)):
            cursor = b"0"
            while True:
                command = pack(("SCAN", cursor, "MATCH", pattern, "COUNT", 1000))
                cursor, names = self._call(node, command, None)
                yield from names
                if cursor in (b"0", 0):
                    break

    # Connections and calls.

    def _deadline(self, timeout: float | None) -> float:
        if timeout is None:
            timeout = self.socket_timeout
        # Capped at the longest ttl: a socket timeout past about 300 years overflows time_t.
        return time.monotonic() + min(timeout, MAX_CALL_TIMEOUT)

    def _state(self) -> _Process:
        process = self._process
        if process is None or process.pid != os.getpid():
            with self._process_lock:
                process = self._process
                if process is None or process.pid != os.getpid():
                    # After fork() the parent's connections are dropped without being closed:
                    # redis-py only shuts a socket down in the process that opened it.
                    process = self._process = _Process()
        return process

    def _cluster(self, process: _Process, deadline: float) -> redis.cluster.RedisCluster:
        with process.lock:
            if process.cluster is not None and process.refresh:
                # A node failed: ask the cluster for its topology again (a failover moves
                # slots to a replica without a MOVED for the slots we never asked about).
                process.refresh = False
                process.moved.clear()
                try:
                    process.cluster.nodes_manager.initialize()
                except redis.exceptions.RedisError as exc:
                    process.refresh = True
                    raise _translate(exc, "refreshing the Redis Cluster topology") from exc
            if process.cluster is None:
                # The topology only; lock calls go through the store's own pools.
                timeout = max(min(self.socket_connect_timeout, deadline - time.monotonic()), 0.001)
                try:
                    process.cluster = redis.cluster.RedisCluster.from_url(
                        self.url,
                        **self._extra,
                        socket_timeout=timeout,
                        socket_connect_timeout=timeout,
                    )
                except redis.exceptions.RedisError as exc:
                    raise _translate(exc, "discovering the Redis Cluster") from exc
            return process.cluster

    def _pool(self, node: tuple[str, int] | None, kind: str) -> Pool:
        process = self._state()
        pool = process.pools.get((kind, node))
        if pool is not None:
            return pool
        with process.lock:
            pool = process.pools.get((kind, node))
            if pool is None:
                kwargs = dict(self._connection_kwargs)
                if node is not None:
                    kwargs["host"], kwargs["port"] = node
                pool = process.pools[kind, node] = Pool(
                    kwargs, self._connection_class, self.max_connections
                )
            return pool

    def _call(
        self,
        node: tuple[str, int] | None,
        command: bytes,
        deadline: float | None,
        script: str | None = None,
        pool: str = "ops",
    ) -> Any:
        """Run ``command`` (in RESP) on ``node`` before ``deadline``; a ``script`` call reloads
        its script on NOSCRIPT.

        Raises ``AskError`` (a Cluster redirection) as it is, every other failure as a
        ``StoreError`` chained to redis-py's error. A connection that failed or timed out is
        discarded; one that got an error reply is in step and goes back to the pool.
        """
        if deadline is None:
            deadline = self._deadline(None)
        if deadline <= time.monotonic():
            raise StoreTimeoutError("The Redis call's timeout had passed before it was sent.")
        connections = self._pool(node, pool)
        conn = connections.get(deadline)
        try:
            conn.ready(deadline, self.socket_connect_timeout, self.socket_timeout)
            try:
                reply = conn.call(command, deadline)
            except redis.exceptions.NoScriptError:
                # The server restarted or ran SCRIPT FLUSH: the script never ran, so loading
                # it and sending the same call again cannot run it twice.
                if script is None:
                    raise
                conn.call(pack(("SCRIPT", "LOAD", _SCRIPTS[script][0])), deadline)
                reply = conn.call(command, deadline)
        except redis.exceptions.ResponseError as exc:
            connections.put(conn)
            if isinstance(exc, redis.exceptions.AskError):
                raise
            raise _translate(exc, f"running {verb(command)}") from exc
        except BaseException as exc:
            connections.discard(conn)
            if isinstance(exc, redis.exceptions.RedisError | OSError):
                if node is not None:
                    self._state().refresh = True
                raise _translate(exc, f"running {verb(command)}") from exc
            raise
        connections.put(conn)
        return reply

    def _pipeline(
        self, node: tuple[str, int] | None, commands: list[bytes], deadline: float
    ) -> list[Any]:
        """Send ``commands`` (in RESP) in one write and read their replies (an error reply comes
        back as its exception, in place): one round trip."""
        if deadline <= time.monotonic():
            raise StoreTimeoutError("The Redis call's timeout had passed before it was sent.")
        connections = self._pool(node, "ops")
        conn = connections.get(deadline)
        try:
            conn.ready(deadline, self.socket_connect_timeout, self.socket_timeout)
            replies = conn.exchange(b"".join(commands), len(commands), deadline)
        except BaseException as exc:
            connections.discard(conn)
            if isinstance(exc, redis.exceptions.RedisError | OSError):
                if node is not None:
                    self._state().refresh = True
                raise _translate(exc, "running a pipeline") from exc
            raise
        connections.put(conn)
        return replies

    def _check_node(self, node: tuple[str, int] | None) -> list[Any]:
        deadline = time.monotonic() + _CHECK_TIMEOUT
        kwargs = self._connection_kwargs
        host, port = node or (kwargs.get("host"), kwargs.get("port"))
        where = f"{host}:{port}" if host else str(kwargs.get("path"))
        config = {}
        try:
            for name in ("appendonly", "appendfsync", "save", "maxmemory-policy"):
                reply = self._call(node, pack(("CONFIG", "GET", name)), deadline)
                config[name] = reply[1].decode() if reply else ""
        except StoreError as exc:
            if not isinstance(exc.__cause__, redis.exceptions.ResponseError):
                raise
            return [
                checks.Warning(
                    f"Redis at {where} refuses CONFIG GET ({exc}), as managed Redis services "
                    "often do: django_locks cannot verify that it persists leases and fencing "
                    "counters and never evicts them.",
                    hint="In your provider's settings make sure of: appendonly yes, appendfsync "
                    "always, maxmemory-policy noeviction. Then silence this warning with "
                    "SILENCED_SYSTEM_CHECKS = ['django_locks.W205'].",
                    id="django_locks.W205",
                )
            ]
        return _config_warnings(where, config)


def _config_warnings(where: str, config: dict[str, str]) -> list[Any]:
    found = []
    fix = "Set 'appendonly yes' and 'appendfsync always' in redis.conf (or with CONFIG SET)."
    if config["appendonly"] != "yes" and not config["save"].strip():
        found.append(
            checks.Warning(
                f"Redis at {where} has no persistence (appendonly no, save ''): a restart "
                "frees every held lock at once, so two processes can hold one lock.",
                hint=fix,
                id="django_locks.W201",
            )
        )
    elif config["appendonly"] != "yes":
        found.append(
            checks.Warning(
                f"Redis at {where} persists only RDB snapshots (appendonly no): a restart "
                "frees every lock taken since the last snapshot while its holder still runs.",
                hint=fix,
                id="django_locks.W202",
            )
        )
    elif config["appendfsync"] != "always":
        found.append(
            checks.Warning(
                f"Redis at {where} fsyncs its append-only file '{config['appendfsync']}', not "
                "'always': a crash of the machine can lose the last locks taken, and the "
                "fencing counters then depend on the server's clock alone.",
                hint="Set 'appendfsync always' in redis.conf (or with CONFIG SET).",
                id="django_locks.W203",
            )
        )
    if config["maxmemory-policy"] != "noeviction":
        found.append(
            checks.Warning(
                f"Redis at {where} evicts keys (maxmemory-policy {config['maxmemory-policy']}): "
                "under memory pressure it can delete a held lock (every lease has a TTL, so "
                "volatile-* policies evict them too).",
                hint="Set 'maxmemory-policy noeviction', and keep caches on another Redis.",
                id="django_locks.W204",
            )
        )
    return found


def _from_cache(alias: str) -> tuple[str, dict[str, Any]]:
    """The URL and connection options of the Redis cache ``alias``, read from settings only."""
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        raise ImproperlyConfigured(
            f"RedisStore option 'cache' names {alias!r}, which is not in CACHES "
            f"({', '.join(map(repr, caches)) or 'none defined'}): name a Redis cache, or use 'url'."
        )
    config = caches[alias]
    if config.get("BACKEND") not in _CACHE_BACKENDS:
        raise ImproperlyConfigured(
            f"RedisStore option 'cache' names {alias!r}, whose BACKEND {config.get('BACKEND')!r} "
            f"is not a Redis cache: use one of {', '.join(_CACHE_BACKENDS)}, or the 'url' option."
        )
    location = config.get("LOCATION")
    if isinstance(location, list | tuple):
        # Both backends write to the first location; the others are read replicas.
        location = location[0] if location else None
    if not isinstance(location, str) or not location:
        location = None
    if location and "," in location:
        location = location.split(",")[0]
    if location is None:
        raise ImproperlyConfigured(
            f"The cache {alias!r} has no LOCATION: set it to a Redis URL, or use 'url'."
        )
    options = dict(config.get("OPTIONS") or {})
    if config["BACKEND"].startswith("django_redis"):
        extra = dict(options.get("CONNECTION_POOL_KWARGS") or {})
        for name in ("PASSWORD", "USERNAME"):
            if name in options:
                extra[name.lower()] = options[name]
    else:
        extra = {k: v for k, v in options.items() if k == k.lower()}
    return location, {k: v for k, v in extra.items() if k not in _CACHE_IGNORED}


class _Names(NamedTuple):
    lease: bytes
    fence: bytes
    released: bytes
    packed_keys: dict[int, bytes]  # the first 2 or 3 names in RESP: a script call's KEYS
    packed_key: bytes  # the key itself in RESP


@functools.lru_cache(maxsize=4096)
def _names(prefix: str, key: str) -> _Names:
    """The names of ``key``'s lease, fencing counter and wake-up list.

    The hash tag is a digest, so braces or any other character in a key cannot move the tag, and
    the three always share one Cluster slot. 128 bits: even a collision would only make two keys
    contend; the shared counter still only grows."""
    tag = hashlib.sha256(key.encode()).hexdigest()[:32]
    base = f"{prefix}:{{{tag}}}:".encode()
    lease, fence, released = base + b"lease", base + b"fence", base + b"released"
    two = bulk(lease) + bulk(fence)
    return _Names(lease, fence, released, {2: two, 3: two + bulk(released)}, bulk(key.encode()))


@functools.lru_cache(maxsize=16)
def _bulk_text(text: str) -> bytes:
    return bulk(text.encode())


def _script_call(script: str, keys: int, args: int) -> bytes:
    """The start of an EVALSHA of ``script`` with ``keys`` KEYS and ``args`` ARGV, in RESP: the
    KEYS and ARGV follow (each a bulk string)."""
    sha = _SCRIPTS[script][1].encode()
    return b"*%d\r\n" % (3 + keys + args) + bulk(b"EVALSHA") + bulk(sha) + bulk(b"%d" % keys)


# The calls of every lock, made of these and the names of _names (no packing per argument).
_CALLS = {
    "acquire": _script_call("acquire", 2, 4),
    "renew": _script_call("renew", 2, 2),
    "release": _script_call("release", 3, 1),
}


def _translate(exc: BaseException, doing: str) -> StoreError:
    """The one place a redis-py error becomes a ``StoreError`` (callers chain it)."""
    if isinstance(exc, redis.exceptions.TimeoutError | socket.timeout | StoreTimeoutError):
        return StoreTimeoutError(f"Redis did not answer in time while {doing}; connection dropped.")
    if isinstance(exc, StoreError):
        return exc
    return StoreError(f"Redis failed while {doing}: {exc}")


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _redact(url: str | None) -> str:
    if url and "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url or ""
