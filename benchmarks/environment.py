"""The benchmark's own servers (the test suite's throwaway PostgreSQL and redis-server) and Django.

PostgreSQL runs with its default durability: the test suite's cluster turns ``fsync`` and
``full_page_writes`` off for speed, so they are turned back on here (``ALTER SYSTEM``, then a
reload, then checked): the floor must be real committed writes. redis-server runs with
``appendonly no`` (Redis's default) and no snapshots during the run; the durable configuration
django_locks' checks ask for (``appendfsync always``) is measured in a section of its own.

:class:`Placement` pins the benchmark's own process to one core and the servers to another
(``sched_setaffinity``, what ``taskset`` does): a server on other hardware, whose CPU the client
does not share, so that what the client costs per operation shows in its throughput.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from tests.servers import find_binary
from tests.servers.postgres import PostgresServer, postgres_bin_dir
from tests.servers.redis import RedisServer
from tests.waiting import eventually

DATABASE = "bench"

PREPARED_ALIAS = "prepared"
"""The same database through psycopg 3's server-side binding and prepared statements (Django's
``OPTIONS``): possible on a direct connection only, not behind PgBouncer before 1.21."""
PREPARED_OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}

DURABLE_POSTGRES = {"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"}


class Unavailable(Exception):
    """A server the benchmark needs cannot be started here."""


def start_postgres() -> PostgresServer:
    if postgres_bin_dir() is None:
        raise Unavailable("PostgreSQL's initdb not found (scripts/install-servers installs it)")
    server = PostgresServer().start()
    try:
        with server.connect() as conn:
            for name, value in DURABLE_POSTGRES.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"CREATE DATABASE {DATABASE}")

        def durable() -> bool:
            with server.connect() as conn:
                return all(
                    conn.execute(f"SHOW {name}").fetchone()[0] == value
                    for name, value in DURABLE_POSTGRES.items()
                )

        eventually(
            durable, timeout=10, what="PostgreSQL with fsync on", every=0.05, ignoring=(Exception,)
        )
    except BaseException:
        server.destroy()
        raise
    return server


def postgres_settings(server: PostgresServer) -> dict[str, str]:
    """What the benchmark prints about the server's durability, read back from it."""
    with server.connect(DATABASE) as conn:
        names = [*DURABLE_POSTGRES, "wal_sync_method", "server_version"]
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in names}


def start_redis() -> RedisServer:
    if find_binary("redis-server", "/usr/bin/redis-server") is None:
        raise Unavailable("redis-server not found (scripts/install-servers installs it)")
    return RedisServer({"appendonly": "no", "save": ""}).start()


def make_redis_durable(server: RedisServer) -> None:
    """``appendonly yes`` + ``appendfsync always``: every write on disk before its reply."""
    with server.client() as client:
        client.config_set("appendfsync", "always")
        client.config_set("appendonly", "yes")

        def rewritten() -> bool:
            info = client.info("persistence")
            return bool(info["aof_enabled"]) and not info["aof_rewrite_in_progress"]

        eventually(
            rewritten,
            timeout=30,
            what="Redis's append-only file rewritten",
            every=0.05,
            ignoring=(Exception,),
        )
        time.sleep(0.2)


def configure_django(server: PostgresServer | None) -> None:
    """Django settings for a database store on the benchmark's PostgreSQL (alias ``default``),
    and the ``Lease`` table migrated there (SQLite in memory when PostgreSQL is not measured)."""
    import django
    from django.conf import settings
    from django.core.management import call_command

    databases: dict[str, Any] = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    }
    if server is not None:
        direct = server.database_settings(DATABASE)
        databases = {"default": direct, PREPARED_ALIAS: {**direct, "OPTIONS": PREPARED_OPTIONS}}
    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        SECRET_KEY="django_locks-benchmarks",
        INSTALLED_APPS=["django_locks"],
        DATABASES=databases,
        LOCKS={"BACKEND": "django_locks.stores.DatabaseStore"},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
    )
    django.setup()
    if server is not None:
        from django.db import connections

        call_command("migrate", verbosity=0)
        connections.close_all()


@contextlib.contextmanager
def servers(stores: set[str]) -> Iterator[dict[str, Any]]:
    """Start the servers ``stores`` need (``postgres``, ``redis``); destroy them at the end."""
    started: dict[str, Any] = {}
    try:
        if "postgres" in stores:
            started["postgres"] = start_postgres()
        if "redis" in stores:
            started["redis"] = start_redis()
        yield started
    finally:
        for server in started.values():
            server.destroy()


# Where the processes run: pinned (client and servers on cores of their own) or not.

CLIENT_CPU = 0
SERVER_CPU = 1


def _tasks(pid: int) -> list[int]:
    """The threads of process ``pid`` (``sched_setaffinity`` pins one thread at a time)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _descendants(root: int) -> list[int]:
    """``root`` and every process under it (PostgreSQL's backends and workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _pin(pids: Iterable[int], cpus: set[int]) -> None:
    for pid in pids:
        for tid in _tasks(pid):
            with contextlib.suppress(ProcessLookupError):  # a thread or backend that just ended
                os.sched_setaffinity(tid, cpus)


class Placement:
    """Pins this process to ``CLIENT_CPU`` and the servers to ``SERVER_CPU``, or undoes it.

    Every thread of each process is pinned, so threads started before (the lock's timer thread,
    the store's watchdog) follow; threads and PostgreSQL backends started later inherit the
    pinning of the thread or postmaster that starts them. Pinning needs two cores: with fewer,
    :attr:`possible` is false and :meth:`pinned` raises."""

    def __init__(self, servers: dict[str, Any]) -> None:
        self.servers = servers
        self.all_cpus = set(os.sched_getaffinity(0))
        self.possible = {CLIENT_CPU, SERVER_CPU} <= self.all_cpus
        self.is_pinned = False

    def _server_pids(self) -> list[int]:
        pids = []
        postgres = self.servers.get("postgres")
        if postgres is not None:
            pids += _descendants(postgres.postmaster_pid)
        redis = self.servers.get("redis")
        if redis is not None and redis.process is not None:
            pids.append(redis.process.pid)
        etcd = self.servers.get("etcd")  # an EtcdCluster: every member's process
        if etcd is not None:
            pids += [m.process.pid for m in etcd.members if m.process is not None]
        return pids

    def pin(self) -> None:
        if not self.possible:
            raise RuntimeError(f"pinning needs cores {CLIENT_CPU} and {SERVER_CPU}")
        _pin(self._server_pids(), {SERVER_CPU})
        _pin([os.getpid()], {CLIENT_CPU})
        self.is_pinned = True

    def unpin(self) -> None:
        _pin(self._server_pids(), self.all_cpus)
        _pin([os.getpid()], self.all_cpus)
        self.is_pinned = False

    @contextlib.contextmanager
    def pinned(self, pinned: bool = True) -> Iterator[None]:
        """Pinned (or, ``pinned=False``, unpinned) for the block; as before after it."""
        was = self.is_pinned
        self.pin() if pinned else self.unpin()
        try:
            yield
        finally:
            self.pin() if was else self.unpin()
