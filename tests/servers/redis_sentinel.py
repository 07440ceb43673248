"""A Sentinel-managed Redis on 127.0.0.1 for the test suite: a master, a replica of it, and three
Sentinels monitoring them as ``mymaster`` (quorum 2), each on ports of its own.

Sentinel timing is sized for the suite: ``down-after-milliseconds`` 1000 (a master silent for
1 s is subjectively down), ``failover-timeout`` 5000. Sentinels run as ``redis-server <conf>
--sentinel`` (Debian's redis-sentinel package is the same binary), each rewriting its own
config file in its own directory, as Sentinel must.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import redis

from tests.servers import dump_log, free_port, port_open
from tests.servers.redis import RedisServer, redis_binaries
from tests.waiting import eventually

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


class Sentinel:
    """One Sentinel process."""

    def __init__(self, master_port: int) -> None:
        self.binary = redis_binaries()[0]
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="django_locks-sentinel-")
        self.log = os.path.join(self.dir, "sentinel.log")
        self.conf = os.path.join(self.dir, "sentinel.conf")
        with open(self.conf, "w") as conf:
            conf.write(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\nlogfile {self.log}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Sentinel:
        self.process = subprocess.Popen(
            [self.binary, self.conf, "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            eventually(lambda: port_open(self.port), timeout=20, what="a Sentinel up", every=0.05)
        except AssertionError as exc:
            raise RuntimeError(f"{exc}\n{dump_log(self.log)}") from exc
        return self

    def master(self) -> tuple[str, int] | None:
        with redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2) as client:
            found = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return (found[0].decode(), int(found[1])) if found else None

    def destroy(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=20)
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelServers:
    """The master, its replica and three Sentinels; ``failover()`` kills the master and waits
    for the Sentinels to promote the replica."""

    def __init__(self) -> None:
        self.master = RedisServer().start()
        self.replica = RedisServer({"replicaof": f"127.0.0.1 {self.master.port}"}).start()
        self.sentinels = [Sentinel(self.master.port).start() for _ in range(3)]
        eventually(self._watched, timeout=30, what="the Sentinels watching the replica")

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels]

    def _watched(self) -> bool:
        with redis.Redis(host="127.0.0.1", port=self.sentinels[0].port) as client:
            replicas = client.execute_command("SENTINEL", "REPLICAS", SERVICE)
            others = client.execute_command("SENTINEL", "SENTINELS", SERVICE)
        return len(replicas) == 1 and len(others) == 2

    def failover(self) -> RedisServer:
        """SIGKILL the master; wait until every Sentinel names the replica; the new master."""
        old, new = self.master, self.replica
        old.kill()
        wanted = ("127.0.0.1", new.port)
        eventually(
            lambda: all(sentinel.master() == wanted for sentinel in self.sentinels),
            timeout=30,
            what=f"the Sentinels promoting {new}",
            every=0.1,
        )
        self.master, self.replica = new, old
        return new

    def destroy(self) -> None:
        for sentinel in self.sentinels:
            sentinel.destroy()
        self.replica.destroy()
        self.master.destroy()

    def logs(self) -> str:
        return "\n".join(dump_log(sentinel.log) for sentinel in self.sentinels)
