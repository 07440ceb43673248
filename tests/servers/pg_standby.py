"""A PostgreSQL primary and its streaming standby on 127.0.0.1, promoted again and again:
``failover()`` SIGKILLs the primary and promotes the standby (``pg_ctl promote``), ``rejoin()``
starts the killed server again, empty, as a ``pg_basebackup`` standby of the new primary.

With ``synchronous=True`` the primary waits for the standby's flush on every commit
(``synchronous_standby_names = '*'``, ``synchronous_commit = on``): a commit answered is on both.
A promoted standby is made synchronous again once its own standby has joined (until then it has
none to wait for, as a failover manager such as Patroni leaves it). ``link(port) -> port`` gives
the port a standby streams from, given its primary's (the fault suite's proxy route, which it
hangs); the identity by default. Clients reach whichever is primary through a multi-host alias
(:meth:`StandbyPair.database_settings`). Like the suite's other clusters these run with
``fsync = off``: the faults kill processes, not the machine, and what a killed server wrote is in
the kernel's page cache."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable
from typing import Any

from tests.servers.postgres import PostgresServer
from tests.waiting import eventually

REPLICATION = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "hot_standby": "on",
    "wal_keep_size": "64MB",
}


class StandbyPair:
    def __init__(
        self,
        *,
        synchronous: bool,
        database: str = "django_locks",
        link: Callable[[int], int] | None = None,
    ) -> None:
        self.synchronous = synchronous
        self.database = database
        self.link = link or (lambda port: port)
        self.primary = PostgresServer(REPLICATION).start()
        conn = self.primary.connect()
        try:
            conn.cursor().execute(f"CREATE DATABASE {database}")
        finally:
            conn.close()
        self.standby = PostgresServer(REPLICATION)
        self.ports = (self.primary.port, self.standby.port)
        self._start_standby()

    def _start_standby(self) -> None:
        """The standby started and streaming; then, when synchronous, the primary waits for it
        (set by ``ALTER SYSTEM`` on the primary alone: a promoted standby starts without one)."""
        self.standby.start(standby_of=self.link(self.primary.port))
        eventually(lambda: self._streaming("async"), timeout=60, what="the standby streaming")
        if self.synchronous:
            self._primary_sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self._primary_sql("SELECT pg_reload_conf()")
            eventually(lambda: self._streaming("sync"), timeout=60, what="the standby in sync")

    def _streaming(self, wanted: str) -> bool:
        rows = self._primary_sql("SELECT state, sync_state FROM pg_stat_replication")
        return any(state == "streaming" and sync == wanted for state, sync in rows)

    def _primary_sql(self, statement: str) -> list[Any]:
        conn = self.primary.connect()
        try:
            cursor = conn.cursor()
            cursor.execute(statement)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            conn.close()

    def database_settings(self, **options: Any) -> dict[str, object]:
        """A ``DATABASES`` entry naming both servers, following the one that accepts writes."""
        return {
            **self.primary.database_settings(self.database),
            "HOST": "127.0.0.1,127.0.0.1",
            "PORT": ",".join(str(port) for port in self.ports),
            "OPTIONS": {"target_session_attrs": "read-write", **options},
            "TEST": {"NAME": self.database},
        }

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every backend of it (its process group)."""
        process = self.primary.process
        assert process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def promote(self) -> None:
        """``pg_ctl promote`` the standby, which is then the primary; it returns once the new
        primary accepts writes."""
        self.standby._run_as_user(
            [f"{self.standby.bin_dir}/pg_ctl", "promote", "-w", "-t", "60", "-D", self.standby.data]
        )
        self.primary, self.standby = self.standby, self.primary
        eventually(self._writable, timeout=60, what="the promoted primary writable", every=0.05)
        # Its copy of the old primary's setting would have it wait for a standby it lacks.
        self._primary_sql("ALTER SYSTEM RESET synchronous_standby_names")
        self._primary_sql("SELECT pg_reload_conf()")

    def _writable(self) -> bool:
        return self._primary_sql("SELECT pg_is_in_recovery()") == [(False,)]

    def failover(self) -> None:
        self.kill_primary()
        self.promote()

    def rejoin(self) -> None:
        """After ``failover()``: the killed server, wiped, a standby of the new primary on its
        own port again; then, when synchronous, the new primary waits for it."""
        shutil.rmtree(self.standby.data, ignore_errors=True)
        self._start_standby()

    def destroy(self) -> None:
        for server in (self.primary, self.standby):
            server.destroy()
