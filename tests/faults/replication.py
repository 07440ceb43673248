"""What the failover scenarios share (tests/faults/redis_faults.py, tests/faults/pg_faults.py):
a replica's replication link through a proxy route of the run's own, and the fault itself, the
link silenced, the primary killed with whatever the link still held, the replica promoted, the
killed server back as the new primary's replica."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.faults.nemesis import Nemesis
from tests.faults.proxy import Proxy

SILENCE_S = (1.0, 3.0)
"""How long the link is silent before the kill: long enough for acquires and renewals to land
in it (on loopback it is otherwise never behind by more than microseconds)."""


class ReplicationFaults(Nemesis):
    link: int  # the proxy route the current replica replicates through

    def replication_link(self) -> Callable[[int], int]:
        """Start the run's proxy; the ``link`` of the servers: given the primary's port, a new
        route to it (the current one), and the port a replica is to replicate from."""
        self.proxy = Proxy().start()
        proxy = self.proxy
        # For the checker: P5's bound, the ttl from a holder's crash (no election to add:
        # tests/faults/figures.py), the crashes' p5_excess and p5_held.
        self.record("cluster", ttl=self.config.ttl, election_s=0.0)

        def link(primary_port: int) -> int:
            self.link = proxy.add_route(("127.0.0.1", primary_port))
            return proxy.port(self.link)

        return link

    def fail_over(
        self, kill: Callable[[], object], promote: Callable[[], object], rejoin: Callable[[], None]
    ) -> None:
        """One fault: the link silent, ``kill()`` the primary, ``promote()`` the replica (once
        it is the primary), ``rejoin()`` the killed server; recorded with its instants. Half
        the time a holder is SIGKILLed with the primary, its takeover spanning the promotion
        (P5: its key free within the ttl, counted on the new primary)."""
        proxy = self.proxy
        assert proxy is not None
        silent = self.rng.uniform(*SILENCE_S)
        start = time.monotonic()
        proxy.hang(self.link)
        self.stop.wait(silent)
        holder = self.pick_holder() if self.rng.random() < 0.5 else None
        killed = time.monotonic()
        if holder is not None:
            self.kill_holder(holder)
        kill()
        proxy.reset(self.link)  # what the link still held is gone with the primary
        proxy.resume(self.link)
        promote()
        promoted = time.monotonic()
        if holder is not None:
            self.replace_worker(holder[0])
        rejoin()
        self.record(
            "fault",
            kind=self.config.scenario,
            pid=None,
            silent=silent,
            killed=killed,
            promoted=promoted,
            start=start,
            end=time.monotonic(),
        )
