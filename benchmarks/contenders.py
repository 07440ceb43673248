"""The lock implementations measured side by side: django_locks on each store, its floors, and
the peers (imported lazily: a peer that is not installed is reported as such, not measured).

Each session belongs to one thread. Peers are used the way their documentation shows, with
their defaults unless noted (a 30 s expiry everywhere, so that nothing lapses during a run).
"""

from __future__ import annotations

import importlib.util
import socket
import urllib.parse
import zlib
from typing import Any

from benchmarks.measure import Contender, Handoff, async_handoff

EXPIRY_S = 30

PEER_PACKAGES = {
    "python-redis-lock": "redis_lock",
    "pottery": "pottery",
}


def installed(distribution: str) -> bool:
    return importlib.util.find_spec(PEER_PACKAGES[distribution]) is not None


class DjangoLocksSession:
    """``Locks(store).acquire()`` / ``lock.release()``, the public API."""

    def __init__(self, locks: Any) -> None:
        self.locks = locks

    def pair(self, key: str) -> None:
        lock = self.locks.acquire(key)
        if lock is None:
            raise RuntimeError(f"{key!r} was taken")
        lock.release()

    def acquire(self, key: str) -> Any:
        lock = self.locks.acquire(key, wait=EXPIRY_S)
        if lock is None:
            raise RuntimeError(f"{key!r} stayed taken for {EXPIRY_S}s")
        return lock

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        pass


def django_locks(name: str, locks: Any, note: str = "") -> Contender:
    return Contender(name, lambda: DjangoLocksSession(locks), note)


def async_django_locks(name: str, locks: Any) -> Contender:
    """django_locks from coroutines: ``aacquire(wait=...)`` / ``arelease()`` on one event
    loop, for the handoff only (its waiters are tasks, not threads)."""

    def unused() -> Any:
        raise NotImplementedError("the async contender measures its handoff only")

    def measure(key: str, *, waiters: int, handoffs: int, hold: float) -> Handoff:
        return async_handoff(
            locks, key, waiters=waiters, handoffs=handoffs, hold=hold, wait=EXPIRY_S
        )

    return Contender(name, unused, measure_handoff=measure)


class PairOnly:
    """A session measured by ``pair()`` alone (a floor, a part of django_locks): it never waits
    for a lock, so the handoff and waiting harnesses cannot use it."""

    def acquire(self, key: str) -> Any:
        raise NotImplementedError(f"{type(self).__name__} only measures pair()")

    def release(self, handle: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} only measures pair()")

    def close(self) -> None:
        pass


class StoreSession(PairOnly):
    """The store's own calls, without the ``Lock`` around them (no renewal timers, no signal):
    how much of django_locks' time is the round trips."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def pair(self, key: str) -> None:
        if self.store.acquire(key, "bench-store-calls", EXPIRY_S * 1000) is None:
            raise RuntimeError(f"{key!r} was taken")
        self.store.release(key, "bench-store-calls")


def store_calls(name: str, store: Any) -> Contender:
    return Contender(name, lambda: StoreSession(store))


# Redis.


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


class PingSession(PairOnly):
    """The floor: two PINGs through redis-py's client."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def pair(self, key: str) -> None:
        self.client.ping()
        self.client.ping()


class PeerLockSession:
    """A peer library's lock objects, one per key, made once: subclasses say how to make one
    (``make``) and how it waits (``wait``); acquiring, releasing and the pair are the same."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.locks: dict[str, Any] = {}

    def make(self, key: str) -> Any:
        raise NotImplementedError

    def wait(self, lock: Any) -> bool:
        """Acquire ``lock``, waiting up to ``EXPIRY_S``; whether it was acquired."""
        raise NotImplementedError

    def _lock(self, key: str) -> Any:
        lock = self.locks.get(key)
        if lock is None:
            lock = self.locks[key] = self.make(key)
        return lock

    def pair(self, key: str) -> None:
        lock = self._lock(key)
        if not lock.acquire(blocking=False):
            raise RuntimeError(f"{key!r} was taken")
        lock.release()

    def acquire(self, key: str) -> Any:
        lock = self._lock(key)
        if not self.wait(lock):
            raise RuntimeError(f"{key!r} stayed taken")
        return lock

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        pass


class RedisPyLockSession(PeerLockSession):
    """redis-py's ``Lock`` (SET NX PX, a Lua release; waiting polls every ``sleep`` seconds)."""

    def __init__(self, client: Any, sleep: float) -> None:
        super().__init__(client)
        self.sleep = sleep

    def make(self, key: str) -> Any:
        return self.client.lock(key, timeout=EXPIRY_S, sleep=self.sleep)

    def wait(self, lock: Any) -> bool:
        return bool(lock.acquire(blocking=True, blocking_timeout=EXPIRY_S))


class RedisLockSession(PeerLockSession):
    """python-redis-lock (SET NX EX; a release pushes to a signal list waiters BLPOP on)."""

    def __init__(self, client: Any) -> None:
        import redis_lock  # type: ignore[import-untyped,import-not-found,unused-ignore]

        super().__init__(client)
        self.module = redis_lock

    def make(self, key: str) -> Any:
        return self.module.Lock(self.client, key, expire=EXPIRY_S)

    def wait(self, lock: Any) -> bool:
        return bool(lock.acquire(blocking=True, timeout=EXPIRY_S))


class RedlockSession(PeerLockSession):
    """pottery's ``Redlock`` on one master (waiting polls with a random sleep)."""

    def __init__(self, client: Any) -> None:
        from pottery import Redlock

        super().__init__(client)
        self.redlock = Redlock

    def make(self, key: str) -> Any:
        return self.redlock(key=key, masters={self.client}, auto_release_time=EXPIRY_S)

    def wait(self, lock: Any) -> bool:
        return bool(lock.acquire(timeout=EXPIRY_S))


def redis_peers(url: str) -> tuple[list[Contender], list[str]]:
    """redis-py's Lock, python-redis-lock and pottery (those installed), and the missing ones."""
    client = redis_client(url)
    peers = [Contender("redis-py Lock", lambda: RedisPyLockSession(client, 0.1))]
    missing = []
    if installed("python-redis-lock"):
        peers.append(Contender("python-redis-lock", lambda: RedisLockSession(client)))
    else:
        missing.append("python-redis-lock")
    if installed("pottery"):
        peers.append(Contender("pottery Redlock", lambda: RedlockSession(client)))
    else:
        missing.append("pottery")
    return peers, missing


def redis_floor(url: str) -> Contender:
    client = redis_client(url)
    return Contender("floor: 2 x PING", lambda: PingSession(client))


class RawPingSession(PairOnly):
    """Two PINGs written and read on a plain socket, without a client: the round trips alone."""

    PING = b"*1\r\n$4\r\nPING\r\n"
    PONG = b"+PONG\r\n"

    def __init__(self, url: str) -> None:
        where = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((where.hostname, where.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as redis-py does

    def pair(self, key: str) -> None:
        for _ in range(2):
            self.sock.sendall(self.PING)
            reply = self.sock.recv(64)
            while len(reply) < len(self.PONG):
                reply += self.sock.recv(64)
            if reply != self.PONG:
                raise RuntimeError(f"PING got {reply!r}")

    def close(self) -> None:
        self.sock.close()


def raw_ping(name: str, url: str) -> Contender:
    return Contender(name, lambda: RawPingSession(url))


# PostgreSQL: plain psycopg connections in autocommit (psycopg 3's default cursor, which
# prepares a statement run more than a few times: the cheapest a driver makes a round trip).

FLOOR_TABLE = "bench_floor"
RAW_LEASE_TABLE = "bench_raw_lease"
RAW_CHANNEL = "bench_raw_lease_released"

SETUP_SQL = [
    f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (id int PRIMARY KEY, n bigint NOT NULL)",
    f"INSERT INTO {FLOOR_TABLE} SELECT i, 0 FROM generate_series(0, 63) AS i "
    "ON CONFLICT DO NOTHING",
    f"""CREATE TABLE IF NOT EXISTS {RAW_LEASE_TABLE} (
        key text PRIMARY KEY, owner text, token bigint NOT NULL DEFAULT 0,
        expires_at timestamptz NOT NULL DEFAULT '-infinity')""",
]
FLOOR_WRITE = f"UPDATE {FLOOR_TABLE} SET n = n + 1 WHERE id = %s RETURNING n"
# The minimal hand-written lease: take it if free or expired (the token grows), free it with a
# notice in the same statement; waiters LISTEN on their own connection.
RAW_ACQUIRE = f"""
INSERT INTO {RAW_LEASE_TABLE} AS lease (key, owner, token, expires_at)
VALUES (%(key)s, %(owner)s, 1, clock_timestamp() + interval '{EXPIRY_S} seconds')
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = lease.token + 1,
    expires_at = excluded.expires_at
WHERE lease.expires_at <= clock_timestamp()
RETURNING lease.token
"""
RAW_RELEASE = f"""
WITH freed AS (
    UPDATE {RAW_LEASE_TABLE} SET expires_at = clock_timestamp()
    WHERE key = %(key)s AND owner = %(owner)s AND expires_at > clock_timestamp()
    RETURNING key)
SELECT pg_notify('{RAW_CHANNEL}', key) FROM freed
"""
# The SQL functions the store calls, of django_locks' migration 0003 (a migration is frozen: so
# are they): the acquire recording the holder (answering with the holder when refused), and the
# release recording how the lease ended; and the channel both releases notify.
PG_ACQUIRE_CALL = "SELECT taken FROM django_locks_acquire_as(%s, %s, %s, %s, %s, %s::bigint)"
PG_RELEASE_CALL = "SELECT django_locks_end(%s, %s, 'released')"
STORE_CHANNEL = "django_locks_released"


def pg_connect(dsn: dict[str, Any]) -> Any:
    import psycopg

    return psycopg.connect(autocommit=True, **dsn)


def pg_setup(dsn: dict[str, Any]) -> None:
    with pg_connect(dsn) as conn:
        for sql in SETUP_SQL:
            conn.execute(sql)


def advisory_id(key: str) -> int:
    return zlib.crc32(key.encode())


class PgSession:
    def __init__(self, dsn: dict[str, Any]) -> None:
        self.conn = pg_connect(dsn)

    def close(self) -> None:
        self.conn.close()


class FloorWriteSession(PgSession, PairOnly):
    """The floor: two committed single-row writes (``UPDATE ... RETURNING``, autocommit)."""

    def pair(self, key: str) -> None:
        row = zlib.crc32(key.encode()) % 64
        self.conn.execute(FLOOR_WRITE, (row,)).fetchone()
        self.conn.execute(FLOOR_WRITE, (row,)).fetchone()


class AdvisorySession(PgSession):
    """``pg_try_advisory_lock`` / ``pg_advisory_unlock`` (session locks: no write, no expiry);
    waiting is ``pg_advisory_lock``, queued in the server."""

    def pair(self, key: str) -> None:
        ident = advisory_id(key)
        if not self.conn.execute("SELECT pg_try_advisory_lock(%s)", (ident,)).fetchone()[0]:
            raise RuntimeError(f"{key!r} was taken")
        self.conn.execute("SELECT pg_advisory_unlock(%s)", (ident,)).fetchone()

    def acquire(self, key: str) -> Any:
        ident = advisory_id(key)
        self.conn.execute("SELECT pg_advisory_lock(%s)", (ident,)).fetchone()
        return ident

    def release(self, handle: Any) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%s)", (handle,)).fetchone()


class RawLeaseSession(PgSession):
    """A raw LISTEN/NOTIFY lease (see ``RAW_ACQUIRE``): a waiter retries when notified."""

    def __init__(self, dsn: dict[str, Any]) -> None:
        super().__init__(dsn)
        self.owner = f"raw-{id(self)}"
        self.conn.execute(f"LISTEN {RAW_CHANNEL}")

    def _try(self, key: str) -> bool:
        params = {"key": key, "owner": self.owner}
        return self.conn.execute(RAW_ACQUIRE, params).fetchone() is not None

    def pair(self, key: str) -> None:
        if not self._try(key):
            raise RuntimeError(f"{key!r} was taken")
        self.release(key)

    def acquire(self, key: str) -> Any:
        while not self._try(key):
            # A notice received since the last look is returned at once (psycopg keeps them).
            for notice in self.conn.notifies(timeout=1.0):
                if notice.payload == key:
                    break
        return key

    def release(self, handle: Any) -> None:
        self.conn.execute(RAW_RELEASE, {"key": handle, "owner": self.owner}).fetchall()


class StoreSqlLeaseSession(PgSession):
    """A raw psycopg lease on the store's own SQL (its functions, which notify on release):
    the same lease protocol and server work as django_locks, without its Python. A waiter
    ``LISTEN``s on its own connection from its first wait on and retries when notified; a
    session that never waited listens to nothing (as django_locks' store, whose one
    listening session per process opens on the first wait)."""

    def __init__(self, dsn: dict[str, Any]) -> None:
        super().__init__(dsn)
        self.owner = f"raw-sql-{id(self)}"
        self.listening = False

    def _try(self, key: str) -> bool:
        args = (key, self.owner, "bench-raw-sql", "process", "", EXPIRY_S * 1000)
        return self.conn.execute(PG_ACQUIRE_CALL, args).fetchone()[0] is not None

    def pair(self, key: str) -> None:
        if not self._try(key):
            raise RuntimeError(f"{key!r} was taken")
        self.release(key)

    def acquire(self, key: str) -> Any:
        while not self._try(key):
            if not self.listening:
                self.conn.execute(f"LISTEN {STORE_CHANNEL}")
                self.listening = True
                continue  # released before the LISTEN took effect: try again at once
            for notice in self.conn.notifies(timeout=1.0):
                if notice.payload == key:
                    break
        return key

    def release(self, handle: Any) -> None:
        self.conn.execute(PG_RELEASE_CALL, (handle, self.owner)).fetchone()


def store_sql_lease(name: str, dsn: dict[str, Any]) -> Contender:
    return Contender(name, lambda: StoreSqlLeaseSession(dsn))


class SqlFunctionSession(PgSession, PairOnly):
    """The store's SQL functions (migration 0002) called on a plain psycopg connection, which
    prepares them: what its operations cost the server, without Django's connection or the
    store's Python around them."""

    def pair(self, key: str) -> None:
        args = (key, "bench-sql-functions", "bench", "process", "", EXPIRY_S * 1000)
        if self.conn.execute(PG_ACQUIRE_CALL, args).fetchone()[0] is None:
            raise RuntimeError(f"{key!r} was taken")
        self.conn.execute(PG_RELEASE_CALL, args[:2]).fetchone()


def sql_functions(name: str, dsn: dict[str, Any]) -> Contender:
    return Contender(name, lambda: SqlFunctionSession(dsn))


def postgres_floor(dsn: dict[str, Any]) -> Contender:
    return Contender("floor: 2 x committed UPDATE", lambda: FloorWriteSession(dsn))


def postgres_peers(dsn: dict[str, Any]) -> list[Contender]:
    return [
        Contender("advisory lock (psycopg)", lambda: AdvisorySession(dsn)),
        Contender("raw LISTEN/NOTIFY lease", lambda: RawLeaseSession(dsn)),
    ]


def select_one(dsn: dict[str, Any]) -> Any:
    """A connection and the call running one ``SELECT 1``."""
    conn = pg_connect(dsn)
    return conn, lambda: conn.execute("SELECT 1").fetchone()
