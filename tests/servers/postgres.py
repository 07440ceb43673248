"""A throwaway PostgreSQL cluster on 127.0.0.1: initdb in a temporary directory, run as an
unprivileged user, stopped and removed at the end of the session."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from typing import Any

from tests.servers import dump_log, find_binary, free_port, port_open
from tests.waiting import eventually

UNPRIVILEGED_USER = "djlocks"
"""The system user the cluster runs as when the suite runs as root (PostgreSQL refuses root)."""

SUPERUSER = "postgres"


def postgres_bin_dir() -> str | None:
    """The directory holding ``initdb`` and ``postgres``: PostgreSQL 15 first, else the newest."""
    initdb = find_binary("initdb")
    if initdb:  # its real directory, which has pg_basebackup and pg_ctl beside it
        return os.path.dirname(os.path.realpath(initdb))
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: (path.split("/")[-3] != "15", -int(path.split("/")[-3])),
    )
    return os.path.dirname(found[0]) if found else None


def unprivileged_user() -> tuple[int, int]:
    """uid and gid to run the cluster as: ours, or (as root) a system user made for it."""
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    try:
        entry = pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                UNPRIVILEGED_USER,
            ],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(UNPRIVILEGED_USER)
    return entry.pw_uid, entry.pw_gid


class PostgresServer:
    """One PostgreSQL cluster, superuser ``postgres`` with trust authentication, loopback only."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.extra = dict(settings or {})  # postgresql.conf lines of its own
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise FileNotFoundError(
                "PostgreSQL's initdb not found (apt-get install postgresql-15, or put its bin "
                "directory on PATH)"
            )
        self.bin_dir = bin_dir
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="django_locks-pg-")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "postgres.log")
        self.uid, self.gid = unprivileged_user()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, standby_of: int | None = None) -> PostgresServer:
        """initdb and start; with ``standby_of`` (a port of a primary, or of a route to it) a
        streaming standby of it instead, its data a ``pg_basebackup`` of the primary's."""
        os.chown(self.dir, self.uid, self.gid)
        os.chmod(self.dir, 0o755)
        if standby_of is None:
            self._run_as_user(
                [
                    f"{self.bin_dir}/initdb",
                    "-D",
                    self.data,
                    "-U",
                    SUPERUSER,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
            )
        else:
            # -R writes standby.signal and primary_conninfo (this port) into the data directory.
            self._run_as_user(
                [
                    f"{self.bin_dir}/pg_basebackup",
                    "-D",
                    self.data,
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(standby_of),
                    "-U",
                    SUPERUSER,
                    "-R",
                    "-X",
                    "stream",
                    "--no-sync",
                    "-c",
                    "fast",
                ],
            )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.dir}'",
            "max_connections": "300",
            "fsync": "off",  # a throwaway cluster: speed over durability
            "full_page_writes": "off",
            "log_min_messages": "warning",
            "log_connections": "off",
            **self.extra,
        }
        with open(os.path.join(self.data, "postgresql.conf"), "a") as fh:
            fh.writelines(f"{name} = {value}\n" for name, value in settings.items())
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [f"{self.bin_dir}/postgres", "-D", self.data],
                stdout=log,
                stderr=subprocess.STDOUT,
                user=self.uid,
                group=self.gid,
                extra_groups=[],
                start_new_session=True,
            )
        try:
            eventually(
                self._ready,
                timeout=60,
                what=f"PostgreSQL on port {self.port} ready",
                every=0.05,
                ignoring=(Exception,),
            )
        except Exception as exc:
            self.destroy()
            raise RuntimeError(f"{exc}\n--- postgres.log ---\n{dump_log(self.log)}") from exc
        return self

    def _run_as_user(self, args: list[str]) -> None:
        result = subprocess.run(
            args, capture_output=True, user=self.uid, group=self.gid, extra_groups=[], cwd=self.dir
        )
        if result.returncode:
            output = result.stdout.decode() + result.stderr.decode()
            raise RuntimeError(f"{args[0]} failed:\n{output}")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"postgres exited:\n{dump_log(self.log)}")
        if not port_open(self.port):
            return False
        conn = self.connect()
        try:
            conn.cursor().execute("SELECT 1")
        finally:
            conn.close()
        return True

    def connect(self, dbname: str = "postgres", *, port: int | None = None) -> Any:
        """A plain driver connection (autocommit) as the superuser, for the tests' own SQL
        (psycopg 3, or psycopg2 where psycopg 3 is not importable)."""
        params: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": port or self.port,
            "user": SUPERUSER,
            "dbname": dbname,
            "connect_timeout": 5,
        }
        try:
            import psycopg
        except ImportError:
            import psycopg2  # type: ignore[import-untyped]

            conn = psycopg2.connect(**params)
            conn.autocommit = True
            return conn
        return psycopg.connect(autocommit=True, **params)

    def database_settings(self, name: str = "django_locks") -> dict[str, object]:
        """A ``DATABASES`` entry for this cluster (its test database is ``test_<name>``)."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": SUPERUSER,
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
        }

    @property
    def postmaster_pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log_tail(self) -> str:
        return dump_log(self.log)

    def destroy(self) -> None:
        """Stop the cluster (fast shutdown, then SIGKILL) and remove its directory."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # in case a test left it stopped
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


# The session's servers. Django's test databases are created for the aliases in DATABASES when
# the first database test runs, so the aliases are added right after collection, and only when
# the selected tests carry the ``postgres`` / ``pgbouncer`` markers.

POSTGRES_ALIAS = "postgres"
PGBOUNCER_ALIAS = "pgbouncer"

SERVERS: dict[str, Any] = {}
UNAVAILABLE: dict[str, str] = {}


def start_for(markers: set[str]) -> None:
    """Start what tests with ``markers`` need and add their ``DATABASES`` aliases."""
    from django.conf import settings
    from django.db import connections

    from tests.servers.pgbouncer import PgBouncerServer

    if not markers & {"postgres", "pgbouncer"}:
        return
    try:
        SERVERS[POSTGRES_ALIAS] = PostgresServer().start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        UNAVAILABLE["postgres"] = UNAVAILABLE["pgbouncer"] = f"PostgreSQL did not start: {exc}"
        return
    aliases = {POSTGRES_ALIAS: SERVERS[POSTGRES_ALIAS].database_settings()}
    if "pgbouncer" in markers:
        try:
            SERVERS[PGBOUNCER_ALIAS] = PgBouncerServer(SERVERS[POSTGRES_ALIAS]).start()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            UNAVAILABLE["pgbouncer"] = f"PgBouncer did not start: {exc}"
        else:
            aliases[PGBOUNCER_ALIAS] = SERVERS[PGBOUNCER_ALIAS].database_settings(POSTGRES_ALIAS)
    # connections.settings is settings.DATABASES itself, with defaults filled in.
    connections.configure_settings({"default": settings.DATABASES["default"], **aliases})
    settings.DATABASES.update(aliases)


def stop_pgbouncer() -> None:
    """Close PgBouncer's server connections, before Django drops the test database."""
    bouncer = SERVERS.get(PGBOUNCER_ALIAS)
    if bouncer is not None:
        bouncer.stop()


def stop_all() -> None:
    for alias in (PGBOUNCER_ALIAS, POSTGRES_ALIAS):
        server = SERVERS.pop(alias, None)
        if server is not None:
            server.destroy()
