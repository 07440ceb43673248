"""A Sentinel-managed Redis on 127.0.0.1 for the test suite: a master, a replica of it, and three
Sentinels monitoring them as ``mymaster`` (quorum 2), each on ports of its own.

Sentinel timing is sized for the suite: ``down-after-milliseconds`` 1500 (a master silent for
1.5 s is subjectively down), ``failover-timeout`` 5000. Not 1000: most likely because a
Sentinel reconnects to an instance at most once a second, right after ``+switch-master`` the new
master's first PING can be answered more than 1 s after the switch, which 1000 counts as
down. A fault run saw it: two Sentinels each found the just-promoted master "down" 1.02 and
1.06 s after their switch, and failed over again, onto the killed master that had just come
back empty and not yet synced. Sentinels run as ``redis-server <conf> --sentinel`` (Debian's
redis-sentinel package is the same binary), each rewriting its own config file in its own
directory, as Sentinel must.

The fault suite (tests/faults/redis_faults.py) puts the replication link through a proxy route
of its own (``link``: the port a replica is to replicate from, given its master's) and fails
over again and again: ``rejoin()`` starts the killed master again, empty, as the new master's
replica. Its ``failover_timeout_ms`` is longer than a replica's turn between failovers: a Sentinel
"fixes" a replica replicating from another address than the master's (the proxy's) once
failover-timeout has passed, which would take the link off the proxy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable

import redis

from tests.servers import dump_log, free_port, port_open
from tests.servers.redis import RedisServer, redis_binaries
from tests.waiting import eventually

SERVICE = "mymaster"
DOWN_AFTER_MS = 1500
FAILOVER_TIMEOUT_MS = 5000


class Sentinel:
    """One Sentinel process."""

    def __init__(self, master_port: int, failover_timeout_ms: int = FAILOVER_TIMEOUT_MS) -> None:
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
                f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}\n"
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

    def __init__(
        self,
        *,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
        link: Callable[[int], int] | None = None,
    ) -> None:
        self.link = link or (lambda port: port)
        self.master = RedisServer().start()
        self.replica = RedisServer(self._replica_of()).start()
        self.sentinels = [Sentinel(self.master.port, failover_timeout_ms).start() for _ in range(3)]
        eventually(self._watched, timeout=30, what="the Sentinels watching the replica")

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels]

    def _replica_of(self) -> dict[str, str]:
        return {"replicaof": f"127.0.0.1 {self.link(self.master.port)}"}

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

    def rejoin(self) -> None:
        """After ``failover()``: the killed master started again, empty, replicating from the
        new master (through ``link``); it returns once its first sync is done."""
        self.replica.wipe()
        self.replica.config |= self._replica_of()
        self.replica.start()
        eventually(self._synced, timeout=30, what=self._unsynced, every=0.05)
        # A failover before every Sentinel saw it back up, as a replica, would find no replica
        # to promote ("-failover-abort-no-good-slave") and leave the service without a master.
        eventually(self._known, timeout=30, what=f"the Sentinels seeing {self.replica}", every=0.1)

    def _known(self) -> bool:
        for sentinel in self.sentinels:
            with redis.Redis(host="127.0.0.1", port=sentinel.port) as client:
                replicas = client.sentinel_slaves(SERVICE)
            if not any(
                replica["port"] == self.replica.port
                and replica["flags"] == "slave"
                and replica.get("role-reported") == "slave"
                for replica in replicas
            ):
                return False
        return True

    def _unsynced(self) -> str:
        """What a replica that did not sync says: its replication state and the logs."""
        try:
            with self.replica.client() as client:
                state = {
                    k: v
                    for k, v in client.info("replication").items()
                    if k.startswith(("role", "master_"))
                }
        except redis.RedisError as exc:
            state = {"error": repr(exc)}
        files = [self.replica.log, self.master.log, *(s.log for s in self.sentinels)]
        logs = [f"--- {path} ---\n{dump_log(path)}" for path in files]
        return "\n".join([f"{self.replica} synced (its replication: {state})", *logs])

    def _synced(self) -> bool:
        with self.replica.client() as client:
            return bool(client.info("replication").get("master_link_status") == "up")

    def destroy(self) -> None:
        for sentinel in self.sentinels:
            sentinel.destroy()
        self.replica.destroy()
        self.master.destroy()

    def logs(self) -> str:
        return "\n".join(dump_log(sentinel.log) for sentinel in self.sentinels)
