"""The fault suite's servers: one PostgreSQL cluster (the protected counters, and the leases of
the DatabaseStore), a redis-server per run, a PgBouncer on demand; pausing and restarting them.

Built on the test suite's own server classes (tests/servers/); nothing here depends on pytest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.children.env import child_env
from tests.servers.pgbouncer import PgBouncerServer
from tests.servers.postgres import PostgresServer
from tests.servers.redis import RedisServer
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent.parent
DATABASE = "faults"
COUNTERS = "testapp_stockcount"
LEADER_WRITES = "testapp_leaderwrite"
LEASES = "django_locks_lease"


class Servers:
    """``Servers().start()``: a PostgreSQL cluster with the ``faults`` database migrated."""

    def __init__(self) -> None:
        self.postgres: PostgresServer | None = None
        self.pgbouncer: PgBouncerServer | None = None

    def start(self) -> Servers:
        self.postgres = PostgresServer().start()
        conn = self.postgres.connect()
        try:
            conn.cursor().execute(f"CREATE DATABASE {DATABASE}")
        finally:
            conn.close()
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v0"],
            env=self.env(),
            cwd=ROOT,
            check=True,
            timeout=300,
        )
        return self

    def database(self, port: int | None = None) -> dict[str, Any]:
        assert self.postgres is not None
        return {
            **self.postgres.database_settings(DATABASE),
            "PORT": str(port or self.postgres.port),
        }

    def env(
        self, store_port: int | None = None, *, worker: dict[str, Any] | None = None
    ) -> dict[str, str]:
        """The environment of a worker: ``default`` direct, ``store`` on ``store_port`` (a proxy
        route or PgBouncer; Django keeps server-side prepared statements off, as PgBouncer's
        transaction mode needs); ``worker``: a fault worker's configuration."""
        databases = {"default": self.database(), "store": self.database(store_port)}
        settings = "tests.faults.settings"
        return child_env(settings=settings, databases=databases, faults_worker=worker)

    def sql(self, statement: str, *params: Any) -> list[Any]:
        assert self.postgres is not None
        conn = self.postgres.connect(DATABASE)
        try:
            cursor = conn.cursor()
            cursor.execute(statement, params or None)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            conn.close()

    def reset(self, keys: list[str]) -> None:
        """Fresh counters (fenced ``f:<key>`` and canary ``c:<key>``), no leases, no leader log."""
        self.sql(f"DELETE FROM {COUNTERS}")
        self.sql(f"DELETE FROM {LEASES}")
        self.sql(f"DELETE FROM {LEADER_WRITES}")
        for key in keys:
            for kind in ("f", "c"):
                self.sql(
                    f"INSERT INTO {COUNTERS} (product, count, fencing_token) VALUES (%s, 0, 0)",
                    f"{kind}:{key}",
                )

    def counters(self) -> list[tuple[str, int]]:
        return [(str(p), int(c)) for p, c in self.sql(f"SELECT product, count FROM {COUNTERS}")]

    def start_pgbouncer(self) -> PgBouncerServer:
        assert self.postgres is not None
        if self.pgbouncer is None:
            self.pgbouncer = PgBouncerServer(self.postgres).start()
        return self.pgbouncer

    def pause_postgres(self, paused: bool) -> None:
        """SIGSTOP / SIGCONT every process of the cluster: the postmaster first (no new
        backends), then its children. Each backend calls setsid(), so the postmaster's process
        group does not hold them."""
        assert self.postgres is not None
        postmaster = self.postgres.postmaster_pid
        pids = [postmaster, *_children(postmaster)]
        for pid in pids if paused else reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def restart_postgres(self) -> None:
        """Immediate shutdown (SIGQUIT: no checkpoint, crash recovery at start), then start."""
        pg = self.postgres
        assert pg is not None and pg.process is not None
        self.pause_postgres(False)
        pg.process.send_signal(signal.SIGQUIT)
        pg.process.wait(timeout=30)
        with open(pg.log, "ab") as log:
            pg.process = subprocess.Popen(
                [f"{pg.bin_dir}/postgres", "-D", pg.data],
                stdout=log,
                stderr=subprocess.STDOUT,
                user=pg.uid,
                group=pg.gid,
                extra_groups=[],
                start_new_session=True,
            )
        eventually(
            pg._ready,
            timeout=60,
            what="PostgreSQL ready after its restart",
            every=0.05,
            ignoring=(Exception,),
        )

    def destroy(self) -> None:
        if self.pgbouncer is not None:
            self.pgbouncer.destroy()
            self.pgbouncer = None
        if self.postgres is not None:
            self.postgres.destroy()
            self.postgres = None


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return children


def start_redis(appendfsync: str = "always") -> RedisServer:
    return RedisServer({"appendfsync": appendfsync}).start()


def pause_redis(server: RedisServer, paused: bool) -> None:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)
