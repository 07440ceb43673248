"""A throwaway PgBouncer in transaction pooling mode in front of the test PostgreSQL cluster."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile

from tests.servers import dump_log, find_binary, free_port, port_open
from tests.servers.postgres import SUPERUSER, PostgresServer
from tests.waiting import eventually

POOL_SIZE = 20
"""Server connections per database and user: fewer than the suite's racing callers."""


class PgBouncerServer:
    """PgBouncer on 127.0.0.1 routing every database name to ``postgres``, ``pool_mode =
    transaction`` (a client gets a server connection for one transaction at a time: session
    state, advisory locks and server-side prepared statements do not survive there)."""

    def __init__(self, postgres: PostgresServer) -> None:
        binary = find_binary("pgbouncer", "/usr/sbin/pgbouncer", "/usr/local/bin/pgbouncer")
        if binary is None:
            raise FileNotFoundError("pgbouncer not found (apt-get install pgbouncer)")
        self.binary = binary
        self.postgres = postgres
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="django_locks-pgbouncer-")
        self.log = os.path.join(self.dir, "pgbouncer.log")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> PgBouncerServer:
        users = os.path.join(self.dir, "userlist.txt")
        with open(users, "w") as fh:
            fh.write(f'"{SUPERUSER}" ""\n')
        config = os.path.join(self.dir, "pgbouncer.ini")
        with open(config, "w") as fh:
            fh.write(
                "[databases]\n"
                f"* = host=127.0.0.1 port={self.postgres.port}\n"
                "[pgbouncer]\n"
                "listen_addr = 127.0.0.1\n"
                f"listen_port = {self.port}\n"
                "unix_socket_dir =\n"
                "auth_type = trust\n"
                f"auth_file = {users}\n"
                f"admin_users = {SUPERUSER}\n"
                "pool_mode = transaction\n"
                f"default_pool_size = {POOL_SIZE}\n"
                "max_client_conn = 1000\n"
                f"logfile = {self.log}\n"
                "ignore_startup_parameters = extra_float_digits\n"
            )
        uid, gid = self.postgres.uid, self.postgres.gid
        os.chown(self.dir, uid, gid)
        for path in (users, config):
            os.chown(path, uid, gid)
        self.process = subprocess.Popen(
            [self.binary, config],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            user=uid,
            group=gid,
            extra_groups=[],
            start_new_session=True,
        )
        try:
            eventually(
                self._ready,
                timeout=30,
                what=f"PgBouncer on port {self.port} ready",
                every=0.05,
                ignoring=(Exception,),
            )
        except Exception as exc:
            self.destroy()
            raise RuntimeError(f"{exc}\n--- pgbouncer.log ---\n{dump_log(self.log)}") from exc
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited:\n{dump_log(self.log)}")
        if not port_open(self.port):
            return False
        conn = self.postgres.connect(port=self.port)
        try:
            conn.cursor().execute("SELECT 1")
        finally:
            conn.close()
        return True

    def database_settings(self, mirror: str) -> dict[str, object]:
        """A ``DATABASES`` entry through PgBouncer, a test mirror of the alias ``mirror``."""
        return {
            **self.postgres.database_settings(),
            "PORT": str(self.port),
            "TEST": {"MIRROR": mirror},
        }

    def log_tail(self) -> str:
        return dump_log(self.log)

    def stop(self) -> None:
        """Stop PgBouncer, closing its server connections (so the test database can be dropped)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
