"""A throwaway three-member etcd cluster on 127.0.0.1 for the test suite.

Each member is Debian's ``/usr/bin/etcd`` (etcd-server 3.4) on client and peer ports of its own
(``free_port``: never 2379/2380, never the packaged service), with its own data directory and log
file in its own ``tempfile.mkdtemp`` directory, and a cluster token of its own, so two clusters
(two sessions, a fault run beside the suite) never join each other.

Measured on the 2-core machine (etcd 3.4.23, otherwise idle, /tmp on ext4):

- ``start()`` of three fresh members, from the first ``Popen`` to every member answering
  ``/health`` and agreeing on a leader: 0.37 to 2.77 s, about 1 s as a rule (9 starts).
- a new leader after SIGKILL of the leader, from the kill to a majority agreeing on another
  member: 1.00 to 2.54 s, median 1.4 s (27 kills). Raft's randomized election timeout is 1 to 2
  x ELECTION_MS; a split vote adds another round. The first write through a survivor, retried
  with a 0.5 s client timeout, succeeded 1.51 to 2.02 s after the kill (5 kills).
- a killed member started again on its data and following the leader: about 0.1 s; the whole
  cluster SIGKILLed and started again (``restart_all()``): 0.44 to 0.53 s, by SIGTERM 0.95 s (once).

Talks to the members through the gRPC gateway's JSON API with the standard library only
(``urllib``), so that the class works where etcd3gw is not installed (the fault suite's parent,
a fast environment's import).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from tests.servers import dump_log, find_binary, free_port, missing, port_open
from tests.waiting import eventually

# Raft timing, in milliseconds, sized for a loaded 2-core machine (the suite runs beside the
# cluster: PostgreSQL, Redis, Celery fleets, pytest itself). The election timeout must stay well
# above the worst stall of a member's heartbeat loop (CPU starvation, a slow fsync), or followers
# start spurious elections; it also sets the cluster's minimum lease TTL (1.5 x election timeout,
# rounded up: 2 s) and how long a leader failover takes. Measured once at these values: 320 s of
# the suite (tests/stores/test_contract.py on every store, test_scale.py, test_celery.py,
# test_run_leader_exec.py) beside an idle cluster, and 60 s of four busy-looping processes on the
# 2 cores, gave no spurious election: raft term unchanged, 0 leader changes, 0 "failed to send out
# heartbeat" or "slow fdatasync" warnings in the members' logs. These are etcd's own defaults;
# kept because they held there. Lowering them buys a faster failover at the price of that margin.
HEARTBEAT_MS = 100
ELECTION_MS = 1000

# How long one status or health request to one member may take before it counts as "no answer"
# (a paused member answers nothing: its TCP connection opens, the reply never comes).
PROBE_TIMEOUT = 0.5


def etcd_binary() -> str:
    """``/usr/bin/etcd``, or skip (fail under CI=true) naming the package."""
    binary = find_binary("etcd", "/usr/bin/etcd", "/usr/local/bin/etcd")
    if binary is None:
        missing("etcd not found (apt-get install etcd-server; scripts/install-servers does)")
    assert binary is not None
    return binary


def gateway(url: str, path: str, body: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """POST ``body`` to the gRPC gateway's ``/v3/<path>`` at ``url``; the decoded answer."""
    request = urllib.request.Request(
        f"{url}/v3/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


class EtcdMember:
    """One member of an :class:`EtcdCluster`; its data directory survives kill / stop / start."""

    def __init__(self, cluster: EtcdCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.name = f"m{index}"
        self.client_port = free_port()
        self.peer_port = free_port()
        assert {self.client_port, self.peer_port}.isdisjoint({2379, 2380})
        self.dir = cluster.make_dir(f"django_locks-etcd-{self.name}-")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "etcd.log")
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.id: str | None = None  # the member id (decimal, as the gateway spells it)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def args(self) -> list[str]:
        # On a restart the data directory already holds the member's WAL: etcd then ignores the
        # --initial-cluster* flags, "new" included (it logs "server has been already initialized"
        # and "restarting local member"), so one command line serves the first start and every
        # restart; --initial-cluster-state existing is only for a member added to a running
        # cluster, which the suite never does.
        return [
            self.cluster.binary,
            "--name",
            self.name,
            "--data-dir",
            self.data,
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            self.peer_url,
            "--initial-advertise-peer-urls",
            self.peer_url,
            "--initial-cluster",
            self.cluster.initial_cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            self.cluster.token,
            "--heartbeat-interval",
            str(HEARTBEAT_MS),
            "--election-timeout",
            str(ELECTION_MS),
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
        ]

    def spawn(self) -> None:
        """Start the process without waiting for it (``start()`` waits)."""
        assert not self.running, f"{self.name} is already running"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.paused = False

    def start(self) -> EtcdMember:
        """Start this member again (same data directory) and wait until the cluster has a leader
        that it follows."""
        self.spawn()
        self.cluster.wait_ready([self])
        return self

    def status(self, *, timeout: float = PROBE_TIMEOUT) -> dict[str, Any]:
        """``/v3/maintenance/status`` of this member (``leader`` and ``header.member_id``)."""
        return gateway(self.url, "maintenance/status", {}, timeout=timeout)

    def healthy(self, *, timeout: float = PROBE_TIMEOUT) -> bool:
        """``/health`` says true: the member has a leader and serves a linearizable read."""
        with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as response:
            return bool(json.loads(response.read()).get("health") == "true")

    def _signal(self, signum: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL (a paused member too): whatever etcd had not fsynced is gone."""
        if self.process is None:
            return
        self._signal(signal.SIGKILL)
        self.process.wait(timeout=20)
        self.process = None
        self.paused = False

    def stop(self) -> None:
        """SIGTERM, etcd's clean shutdown (a paused member is resumed first to receive it)."""
        if self.process is None:
            return
        self.resume()
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        self.process = None

    def pause(self) -> None:
        """SIGSTOP: the process holds its ports and answers nothing until ``resume()``."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.paused and self.running:
            self._signal(signal.SIGCONT)
        self.paused = False

    def client(self, *, timeout: float = 5) -> Any:
        """An ``etcd3gw.Etcd3Client`` on this member alone (etcd3gw imported here: the class
        itself needs only the standard library)."""
        try:
            import etcd3gw
        except ImportError:
            missing("etcd3gw is not installed (pip install -r requirements-dev.txt)")
        # The API path is given: etcd3gw would otherwise ask /version first, one more request.
        return etcd3gw.Etcd3Client(
            host="127.0.0.1", port=self.client_port, timeout=timeout, api_path="/v3/"
        )

    def logs(self, lines: int = 60) -> str:
        return f"--- {self.log} ---\n{dump_log(self.log, lines=lines)}"

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "down"
        return f"<EtcdMember {self.name} {self.url} {state}>"


class EtcdCluster:
    """``size`` etcd members on loopback, bootstrapped together (``--initial-cluster-state new``).

    ``endpoints`` are the client URLs; ``member(i)`` kills, stops, pauses, resumes or restarts one
    member; ``leader()`` is the index of the member a majority follows.
    """

    def __init__(self, size: int = 3) -> None:
        self.binary = etcd_binary()
        self.token = f"django-locks-{uuid.uuid4().hex[:12]}"
        self._dirs: list[str] = []
        self.members = [EtcdMember(self, index) for index in range(size)]
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def make_dir(self, prefix: str) -> str:
        path = tempfile.mkdtemp(prefix=prefix)
        self._dirs.append(path)
        return path

    @property
    def endpoints(self) -> list[str]:
        return [member.url for member in self.members]

    def member(self, index: int) -> EtcdMember:
        return self.members[index]

    def start(self) -> EtcdCluster:
        """Start every member (together: each waits for the others' peer ports) and wait until
        each answers and a leader exists; on a failure, every member's log in the error."""
        for member in self.members:
            member.spawn()
        self.wait_ready(self.members)
        return self

    def wait_ready(self, members: list[EtcdMember], timeout: float = 60) -> float:
        """Wait until each of ``members`` answers ``/health`` and all agree on one leader; the
        seconds it took. A member that exited, or a timeout, raises with the logs."""
        started = time.monotonic()

        def ready() -> bool:
            for member in members:
                if not member.running:
                    raise RuntimeError(f"etcd {member.name} exited")
                if not port_open(member.client_port) or not member.healthy():
                    return False
                if member.id is None:
                    member.id = member.status()["header"]["member_id"]
            leader = self.leader()
            return leader is not None and all(
                m.status()["leader"] == self.members[leader].id for m in members
            )

        try:
            eventually(
                ready,
                timeout=timeout,
                what=f"etcd members {[m.name for m in members]} ready with one leader",
                every=0.05,
                ignoring=(OSError, KeyError, ValueError),
            )
        except (AssertionError, RuntimeError) as exc:
            raise RuntimeError(f"{exc}\n{self.logs()}") from exc
        return time.monotonic() - started

    def leader(self) -> int | None:
        """The index of the leader a majority of the cluster reports (asking each running, not
        paused member), else None (no quorum, an election under way, a split view)."""
        votes: dict[str, int] = {}
        for member in self.members:
            if not member.running or member.paused:
                continue
            try:
                status = member.status()
            except (OSError, ValueError):
                continue
            member.id = status["header"]["member_id"]
            leader = status.get("leader", "0")
            if leader != "0":
                votes[leader] = votes.get(leader, 0) + 1
        quorum = len(self.members) // 2 + 1
        for index, member in enumerate(self.members):
            if member.id is not None and votes.get(member.id, 0) >= quorum:
                return index if member.running and not member.paused else None
        return None

    def wait_for_leader(self, timeout: float = 10, *, other_than: int | None = None) -> int:
        """Wait until a majority follows a leader (``other_than`` not that index); its index."""
        found: list[int] = []

        def elected() -> bool:
            index = self.leader()
            if index is None or index == other_than:
                return False
            found.append(index)
            return True

        eventually(elected, timeout=timeout, what=self._no_leader, every=0.02)
        return found[-1]

    def _no_leader(self) -> str:
        return f"a leader of {self.members}\n{self.logs(lines=20)}"

    def restart_all(self, *, hard: bool = True) -> float:
        """Every member SIGKILLed (``hard``) or stopped by SIGTERM, then all started again on
        their data; the seconds from the first start until the cluster is ready again."""
        for member in self.members:
            member.kill() if hard else member.stop()
        for member in self.members:
            member.spawn()
        return self.wait_ready(self.members)

    def heal(self) -> None:
        """Every member running and resumed, and a leader: what a test leaves behind is undone."""
        for member in self.members:
            member.resume()
        down = [member for member in self.members if not member.running]
        for member in down:
            member.spawn()
        self.wait_ready(self.members)

    def destroy(self) -> None:
        for member in self.members:
            member.kill()
        for path in self._dirs:
            shutil.rmtree(path, ignore_errors=True)

    def logs(self, lines: int = 60) -> str:
        return "\n".join(member.logs(lines) for member in self.members)

    def __repr__(self) -> str:
        return f"<EtcdCluster {self.endpoints}>"
