"""The fault suite's servers: one PostgreSQL cluster (the protected counters, and the leases of
the DatabaseStore), a redis-server per run, a PgBouncer and a SQLite file on demand; pausing and
restarting them.

Built on the test suite's own server classes (tests/servers/); nothing here depends on pytest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
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
MIGRATE = [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v0"]


class Servers:
    """``Servers().start()``: a PostgreSQL cluster with the ``faults`` database migrated."""

    def __init__(self) -> None:
        self.postgres: PostgresServer | None = None
        self.pgbouncer: PgBouncerServer | None = None
        self.sqlite: Path | None = None  # the SQLite store's file, once started

    def start(self) -> Servers:
        self.postgres = PostgresServer().start()
        conn = self.postgres.connect()
        try:
            conn.cursor().execute(f"CREATE DATABASE {DATABASE}")
        finally:
            conn.close()
        subprocess.run(
            MIGRATE,
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
        self,
        store_port: int | None = None,
        *,
        worker: dict[str, Any] | None = None,
        sqlite: bool = False,
        store: dict[str, Any] | None = None,
    ) -> dict[str, str]:
        """The environment of a worker: ``default`` direct, ``store`` on ``store_port`` (a proxy
        route or PgBouncer; Django keeps server-side prepared statements off, as PgBouncer's
        transaction mode needs), with ``sqlite`` the SQLite file, or ``store`` itself (a
        primary and its standby); ``worker``: a fault worker's configuration."""
        if store is None:
            store = self.sqlite_database() if sqlite else self.database(store_port)
        databases = {"default": self.database(), "store": store}
        settings = "tests.faults.settings"
        return child_env(settings=settings, databases=databases, faults_worker=worker)

    def migrate_store(self, store: dict[str, Any]) -> None:
        """The lock tables on the ``store`` alias ``store`` (a database of its own)."""
        self._migrate(self.env(store=store))

    def _migrate(self, env: dict[str, str]) -> None:
        subprocess.run(
            [*MIGRATE, "--database", "store"], env=env, cwd=ROOT, check=True, timeout=300
        )

    def sql(self, statement: str, *params: Any) -> list[Any]:
        assert self.postgres is not None
        conn = self.postgres.connect(DATABASE)
        try:
            cursor = conn.cursor()
            cursor.execute(statement, params or None)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            conn.close()

    def reset(self, keys: list[str], *, sqlite: bool = False) -> None:
        """Fresh counters (fenced ``f:<key>``, canary ``c:<key>``, atomic canary ``a:<key>``),
        no leases, no leader log; with ``sqlite`` the atomic canary's rows and the leases in the
        SQLite file."""
        self.sql(f"DELETE FROM {COUNTERS}")
        self.sql(f"DELETE FROM {LEASES}")
        self.sql(f"DELETE FROM {LEADER_WRITES}")
        for key in keys:
            for kind in ("f", "c") if sqlite else ("f", "c", "a"):
                self.sql(
                    f"INSERT INTO {COUNTERS} (product, count, fencing_token) VALUES (%s, 0, 0)",
                    f"{kind}:{key}",
                )
        if sqlite:
            self.start_sqlite()
            self.sqlite_sql(f"DELETE FROM {COUNTERS}")
            self.sqlite_sql(f"DELETE FROM {LEASES}")
            for key in keys:
                self.sqlite_sql(
                    f"INSERT INTO {COUNTERS} (product, count, fencing_token) VALUES (?, 0, 0)",
                    f"a:{key}",
                )

    def counters(self, *, sqlite: bool = False) -> list[tuple[str, int]]:
        """Every counter: the atomic canary's from the SQLite file with ``sqlite``."""
        rows = self.sql(f"SELECT product, count FROM {COUNTERS}")
        if sqlite:
            rows = [r for r in rows if not r[0].startswith("a:")]
            rows += self.sqlite_sql(f"SELECT product, count FROM {COUNTERS}")
        return [(str(p), int(c)) for p, c in rows]

    # The SQLite store: one file in WAL mode, shared by the workers of every SQLite run.

    def sqlite_database(self) -> dict[str, Any]:
        assert self.sqlite is not None
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(self.sqlite),
            # lock.atomic() needs it (Django 5.1+): the write lock from BEGIN to COMMIT.
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }

    def start_sqlite(self) -> Path:
        """The file, migrated and in WAL mode (a mode the file keeps), on first use."""
        if self.sqlite is None:
            self.sqlite = Path(tempfile.mkdtemp(prefix="faults-sqlite-")) / "store.sqlite3"
            self._migrate(self.env(sqlite=True))
            mode = self.sqlite_sql("PRAGMA journal_mode = WAL")
            assert mode == [("wal",)], mode
        return self.sqlite

    def sqlite_sql(self, statement: str, *params: Any) -> list[Any]:
        assert self.sqlite is not None
        conn = sqlite3.connect(self.sqlite, timeout=30, isolation_level=None)
        try:
            return list(conn.execute(statement, params).fetchall())
        finally:
            conn.close()

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
        if self.sqlite is not None:
            shutil.rmtree(self.sqlite.parent, ignore_errors=True)
            self.sqlite = None
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
