"""The fault suite on etcd: a three-member cluster per run (tests/servers/etcd.py), the workers'
way to it, and the etcd scenarios' faults.

Each worker builds ``EtcdStore(endpoints=[...])`` on the three members' client URLs, direct, or
under ``etcd_hung_route`` through three routes of the suite's proxy of its own (one per member),
which the nemesis hangs together: the holder's whole route to the cluster goes silent, as a
partition of its host would make it, while the other workers and the members go on. Hanging one
member's route only would be a partial partition that the store's failover to the next endpoint
answers; a paused member (``etcd_member_pause``) is that case for every worker at once.

The fenced counters stay in the suite's PostgreSQL database (``default``), as on every store:
the rows a token fences do not live in the lock store.

**The ttl on etcd is 3 s** (:data:`ETCD_TTL`), not the 2 s of the other stores. etcd grants
leases in whole seconds and never below its minimum, 1.5 x the election timeout rounded up: 2 s
with the cluster's ``--election-timeout 1000``. 3 s is a whole number of seconds (the effective
ttl is the ttl asked, no rounding), above that minimum, and longer than a leader failover on
this machine (a new leader 1.0 to 2.5 s after a kill, tests/servers/etcd.py): a lock renewed
every ttl/3 = 1 s can outlive one election, which a 2 s lease (renewed every 0.67 s, its deadline
1.98 s after a renewal) mostly cannot. The figures stay comparable: sections of up to a ttl
(LONG_SECTIONS' multiples under the etcd scenarios), faults of 0.5 to 3 ttl.
"""

from __future__ import annotations

import time
from typing import Any

from tests.faults.nemesis import Nemesis
from tests.faults.proxy import Proxy
from tests.servers.etcd import ELECTION_MS, EtcdCluster

ETCD_TTL = 3.0
ELECTION_S = ELECTION_MS / 1000
ETCD_SCENARIOS: dict[str, str] = {
    "etcd_leader_kill": "the etcd leader SIGKILLed, restarted 2 to 5 s later; half the time a "
    "holder SIGKILLed with it (its takeover across the leader change)",
    "etcd_member_pause": "an etcd member SIGSTOPped for 0.5 to 3 ttl (the leader a third of the "
    "time), then SIGCONT",
    "etcd_hung_route": "a holder's routes to all three etcd members hung 0.5 to 3 ttl (proxy, "
    "no reset)",
    "etcd_cluster_restart": "all three etcd members SIGKILLed, started again 0 to 1 ttl later",
}
ETCD_GENERIC = (
    "baseline",
    "holder_pause",
    "request_pause",
    "delayed_write",
    "holder_kill",
    "permits",
    "replace",
    "max_hold",
)
"""The scenarios of every store that also run on etcd (``permits`` and ``replace`` hang a
holder's three routes; ``replace``'s stale request is :func:`stale_request`). Not the ones whose
fault is another store's server (``store_pause``, ``store_restart``: the etcd scenarios are
their forms here, and ``hung_connection`` is ``etcd_hung_route``), nor ``leader``,
``atomic_pgbouncer`` and ``wallclock`` (``run_leader`` with its own settings, PgBouncer, a
server whose "now" a client's clock could move)."""
LEADER_SHARE = 1 / 3
"""The share of ``etcd_member_pause`` faults that pause the leader."""


def start_etcd() -> EtcdCluster:
    """A fresh three-member cluster (the test suite's own class), started and with a leader."""
    cluster = EtcdCluster()
    try:
        cluster.start()
    except BaseException:
        cluster.destroy()
        raise
    return cluster


def stale_request(cluster: EtcdCluster, key: str, token: int, stale: int) -> bool:
    """The ``replace`` scenario's stale request on etcd: ``stale`` written as ``key``'s preempt
    request (``<prefix>/p/<key>``) if its lease's token is ``token`` and no request names
    ``token`` already (a genuine request is never overwritten); whether it was written."""
    from django_locks.stores.etcd import wire as ops
    from django_locks.stores.etcd.records import Layout
    from tests.servers.etcd import gateway

    names = Layout("django_locks").names(key)
    value = str(stale).encode()
    named = {"target": "VALUE", "key": ops.b64(names.preempt),
             "value": ops.b64(str(token).encode()), "result": "NOT_EQUAL"}  # fmt: skip
    body = {
        "compare": [ops.created_at(names.lease, token)],
        "success": [
            ops.txn(
                [ops.absent(names.preempt)],
                [ops.put(names.preempt, value)],
                [ops.txn([named], [ops.put(names.preempt, value)])],
            )
        ],
    }
    for member in cluster.members:
        if member.running and not member.paused:
            reply = gateway(member.url, "kv/txn", body, timeout=5)
            break
    else:
        return False
    if not reply.get("succeeded"):
        return False
    inner = reply["responses"][0]["response_txn"]
    return bool(inner.get("succeeded")) or bool(
        inner["responses"][0]["response_txn"].get("succeeded")
    )


def etcd_routes(cluster: EtcdCluster, proxy: Proxy) -> list[int]:
    """A worker's own proxy routes, one to each member's client port (in member order)."""
    return [proxy.add_route(("127.0.0.1", m.client_port)) for m in cluster.members]


def etcd_spec(cluster: EtcdCluster, proxy: Proxy | None, routes: list[int]) -> dict[str, Any]:
    """The worker's store (tests/faults/store.py): the members' URLs, or its routes' when it
    has them."""
    if routes:
        assert proxy is not None
        return {
            "kind": "etcd",
            "endpoints": [f"http://127.0.0.1:{proxy.port(r)}" for r in routes],
        }
    return {"kind": "etcd", "endpoints": cluster.endpoints}


class EtcdFaults(Nemesis):
    """The etcd scenarios' faults, for ``harness.Run`` (``etcd``: the run's ``EtcdCluster``).

    Member faults are recorded with ``pid=None`` (the checker's windows and deaths are the
    workers'), the member's index, and whether it was the leader; ``elected`` is when a
    majority was seen following another leader (None when the leader did not change), the
    instant P5's bound on etcd counts from (tests/faults/figures.py)."""

    etcd: EtcdCluster | None

    @property
    def cluster(self) -> EtcdCluster:
        assert self.etcd is not None
        return self.etcd

    def _leader(self) -> int | None:
        try:
            return int(self.cluster.wait_for_leader(timeout=10))
        except AssertionError:
            return None

    def _elected(self, old: int, timeout: float) -> tuple[int | None, float | None]:
        """Wait up to ``timeout`` for a leader other than ``old``: (its index, when seen)."""
        try:
            new = self.cluster.wait_for_leader(timeout=max(timeout, 0.1), other_than=old)
        except AssertionError:
            return None, None
        return int(new), time.monotonic()

    def fault_etcd_leader_kill(self) -> None:
        leader = self._leader()
        if leader is None:
            return
        holder = self.pick_holder() if self.rng.random() < 0.5 else None
        member = self.cluster.member(leader)
        down = self.rng.uniform(2.0, 5.0)
        if holder is not None:
            self.kill_holder(holder)
        start = time.monotonic()
        member.kill()
        new, elected = self._elected(leader, 30)
        if holder is not None:
            self.replace_worker(holder[0])
        self.stop.wait(max(0.0, start + down - time.monotonic()))
        member.start()
        self.record(
            "fault",
            kind="etcd_leader_kill",
            pid=None,
            member=leader,
            leader=True,
            new_leader=new,
            elected=elected,
            start=start,
            end=time.monotonic(),
        )

    def fault_etcd_member_pause(self) -> None:
        leader = self._leader()
        if leader is None:
            return
        if self.rng.random() < LEADER_SHARE:
            index = leader
        else:
            index = self.rng.choice([i for i in range(len(self.cluster.members)) if i != leader])
        member = self.cluster.member(index)
        pause = self.duration()
        start = time.monotonic()
        member.pause()
        new, elected = None, None
        if index == leader:
            new, elected = self._elected(leader, pause)
        self.stop.wait(max(0.0, start + pause - time.monotonic()))
        member.resume()
        self.record(
            "fault",
            kind="etcd_member_pause",
            pid=None,
            member=index,
            leader=index == leader,
            new_leader=new,
            elected=elected,
            start=start,
            end=time.monotonic(),
        )

    def fault_etcd_hung_route(self) -> None:
        self.fault_hung_connection("etcd_hung_route")

    def fault_etcd_cluster_restart(self) -> None:
        down = self.rng.uniform(0.0, 1.0) * self.config.ttl
        start = time.monotonic()
        for member in self.cluster.members:
            member.kill()
        self.stop.wait(down)
        for member in self.cluster.members:
            member.spawn()
        ready = self.cluster.wait_ready(self.cluster.members)
        now = time.monotonic()
        self.record(
            "fault",
            kind="etcd_cluster_restart",
            pid=None,
            down=down,
            ready=ready,
            elected=now,  # the restarted cluster's first leader, every lease restarted
            start=start,
            end=now,
        )
