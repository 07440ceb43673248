"""The fault suite on Redis with Sentinel: a master, its replica and three Sentinels per run
(tests/servers/redis_sentinel.py), the workers' way to them, and the failover fault.

Each worker builds ``RedisStore(sentinels=[...], service_name="mymaster")``, under
``sentinel_failover_confirmed`` with ``min_replicas=1`` as well. The fenced counters stay in the
suite's PostgreSQL database, as on every store.

**The fault** (every ~10 s, tests/faults/replication.py): the replica's replication link goes
silent for 1 to 3 s (it runs through a proxy route of the run's own, hung as a congested or
partitioned network would be: long enough for acquires and renewals to land in it), then the
master is SIGKILLed, with whatever the link still held, and half the time a holder with it; the
Sentinels (``down-after`` 1.5 s) promote the replica, about 2.9 s after the kill on this machine;
the killed server is then started again, empty, as the new master's replica, through a new
route, and the next fault waits until every Sentinel sees it back as a replica. What the master
granted or renewed while the link was silent never reached the server that is master next: that
is the loss Redis replication is known for, made to happen every time rather than by luck (on
loopback the link is otherwise never behind by more than a few microseconds).

**The ttl is 6 s** (:data:`SENTINEL_TTL`): a lease must outlive a failover (the 1 to 3 s of
silence, then about 2.9 s) for the failover to cost anything but the lease itself; with 2 s
leases every holder is past its deadline before a new master exists, and no overlap could ever
be seen. Sections last up to 2 ttl, so that holders hold across failovers.
"""

from __future__ import annotations

from typing import Any

from tests.faults.replication import ReplicationFaults
from tests.servers.redis_sentinel import SERVICE, SentinelServers

SENTINEL_TTL = 6.0
FAILOVER_TIMEOUT_MS = 60_000
"""Longer than a replica's turn between two failovers (at most ~16 s): see
tests/servers/redis_sentinel.py."""
SENTINEL_SCENARIOS: dict[str, str] = {
    "sentinel_failover": "the replica's link silent 1-3 s, the master SIGKILLed, Sentinel "
    "promoting the replica, the old master back as its replica",
    "sentinel_failover_confirmed": "the same, the store with min_replicas=1",
}


class SentinelFaults(ReplicationFaults):
    """The Sentinel scenarios' servers and fault, for ``harness.Run``."""

    sentinel: SentinelServers | None

    def start_sentinel(self) -> None:
        link = self.replication_link()
        self.sentinel = SentinelServers(failover_timeout_ms=FAILOVER_TIMEOUT_MS, link=link)

    def sentinel_spec(self) -> dict[str, Any]:
        assert self.sentinel is not None
        return {
            "kind": "redis",
            "sentinels": self.sentinel.addresses,
            "service_name": SERVICE,
            "min_replicas": 1 if self.config.scenario == "sentinel_failover_confirmed" else 0,
        }

    def fault_sentinel_failover(self) -> None:
        servers = self.sentinel
        assert servers is not None
        self.fail_over(servers.master.kill, servers.failover, servers.rejoin)

    fault_sentinel_failover_confirmed = fault_sentinel_failover
