"""A throwaway ``redis-server`` (and a 3-master Redis Cluster) on 127.0.0.1 for the test suite."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence

import redis

from tests.servers import dump_log, find_binary, free_port, missing, port_open
from tests.waiting import eventually

# A configuration fencing is safe on: every write on disk before the reply, nothing evicted.
DURABLE = {
    "appendonly": "yes",
    "appendfsync": "always",
    "save": "",
    "maxmemory-policy": "noeviction",
}


def redis_binaries() -> tuple[str, str]:
    """``redis-server`` and ``redis-cli``, or skip (fail under CI=true) naming what is missing."""
    server = find_binary("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")
    cli = find_binary("redis-cli", "/usr/bin/redis-cli", "/usr/local/bin/redis-cli")
    if server is None or cli is None:
        missing("redis-server / redis-cli not found (apt-get install redis-server redis-tools)")
    assert server is not None and cli is not None
    return server, cli


class RedisServer:
    """One ``redis-server`` in its own temporary directory, configured on the command line.

    ``config`` holds redis.conf directives (``{"appendfsync": "everysec"}``); the data directory
    and port survive ``stop()`` / ``kill()`` so that ``start()`` again is a restart.
    """

    def __init__(self, config: dict[str, str] | None = None, *, extra: Sequence[str] = ()) -> None:
        self.binary, self.cli = redis_binaries()
        self.config = {**DURABLE, **(config or {})}
        self.extra = list(extra)
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="django_locks-redis-")
        self.log = os.path.join(self.dir, "redis.log")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir]
        args += ["--logfile", self.log, "--daemonize", "no", "--protected-mode", "no"]
        for name, value in self.config.items():
            args += [f"--{name}", value]
        args += self.extra
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            eventually(
                self._ready,
                timeout=20,
                what=f"redis-server on port {self.port} ready",
                every=0.05,
                ignoring=(Exception,),
            )
        except AssertionError as exc:
            raise RuntimeError(f"{exc}\n--- redis.log ---\n{dump_log(self.log)}") from exc
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited:\n{dump_log(self.log)}")
        if not port_open(self.port):
            return False
        # PING answers LOADING while the append-only file is replayed; wait for a real answer.
        with self.client() as client:
            return bool(client.ping())

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        """A clean shutdown (SIGTERM, as SHUTDOWN): the append-only file is fsynced first."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        self.process = None

    def kill(self) -> None:
        """``kill -9``: whatever the server had not written to the file is gone."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=20)
        self.process = None

    def restart(self, *, hard: bool = False) -> None:
        self.kill() if hard else self.stop()
        self.start()

    def wipe(self) -> None:
        """Forget the data on disk (for a restart that lost everything)."""
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if name != "redis.log":
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    def script_flush(self) -> None:
        with self.client() as client:
            client.script_flush()

    def destroy(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"<RedisServer {self.url} {self.dir}>"


class RedisClusterServers:
    """Three masters with ``--cluster-enabled yes``, joined by ``redis-cli --cluster create``."""

    def __init__(self, masters: int = 3) -> None:
        # The bus port is set explicitly: port + 10000 may not be free, or may not exist.
        self.nodes = []
        for _ in range(masters):
            node = RedisServer({"cluster-enabled": "yes", "cluster-node-timeout": "5000"})
            node.extra = [
                "--cluster-port",
                str(free_port()),
                "--cluster-config-file",
                os.path.join(node.dir, "nodes.conf"),
            ]
            self.nodes.append(node)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisClusterServers:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        created = subprocess.run(
            [
                self.nodes[0].cli,
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if created.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}"
            )
        eventually(
            self._ok, timeout=30, what="the Redis Cluster ready", every=0.05, ignoring=(Exception,)
        )
        return self

    def _ok(self) -> bool:
        for node in self.nodes:
            with node.client() as client:
                info = client.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
        return True

    def script_flush(self) -> None:
        for node in self.nodes:
            node.script_flush()

    def destroy(self) -> None:
        for node in self.nodes:
            node.destroy()

    def logs(self) -> str:
        return "\n".join(f"--- {node.log} ---\n{dump_log(node.log)}" for node in self.nodes)
