"""``python -m tests.faults.etcd_early_revoke``: does a paused etcd leader, on resuming, revoke
leases that were kept alive through the new leader? Without django_locks: raw gateway calls.

    python -m tests.faults.etcd_early_revoke --rounds 12 --pause 7 --ttl 5 --leases 5
    python -m tests.faults.etcd_early_revoke --binary /path/to/etcd --rounds 12

Each round grants ``--leases`` leases through a follower and keeps each alive from a thread of
its own, every 0.25 s, through the members that are not paused (0.3 s per member); the leader is
SIGSTOPped for ``--pause`` seconds, then SIGCONTed, and the keepalives go on for the ttl and 2 s
more. A keepalive answered with no TTL finds its lease gone; it is *early* when that is more
than 0.3 s before the last successful keepalive's TTL ran out (counted from when that keepalive
was sent), which no expiry explains. Prints a line per round, the seconds from the SIGCONT to
each early loss, and the totals; exits 1 when a lease was lost early.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from dataclasses import dataclass, field

from tests.servers.etcd import EtcdCluster, EtcdMember, gateway

EARLY_MARGIN = 0.3  # seconds before the TTL ran out: more than any clock or scheduling slack


@dataclass
class Keeper:
    """Keeps one lease alive through ``members`` until ``stop``; what became of it."""

    lease: str
    ttl: int
    members: list[EtcdMember]
    stop: threading.Event
    lost_at: float | None = None  # monotonic, when a keepalive found the lease gone
    early_by: float = 0.0  # seconds before the last keepalive's TTL ran out
    thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        alive_until = time.monotonic() + self.ttl
        while not self.stop.is_set():
            for member in self.members:
                sent = time.monotonic()
                try:
                    answer = gateway(member.url, "lease/keepalive", {"ID": self.lease}, timeout=0.3)
                except OSError:
                    continue  # that member has no leader yet, or is slow: the next one
                ttl = int(answer.get("result", {}).get("TTL", 0))
                if ttl <= 0:
                    self.lost_at = time.monotonic()
                    self.early_by = alive_until - self.lost_at
                    return
                alive_until = sent + ttl
                break
            self.stop.wait(0.25)


def one_round(cluster: EtcdCluster, *, pause: float, ttl: int, leases: int) -> list[float]:
    """One pause of the leader; for each lease lost early, the seconds from the SIGCONT."""
    leader = cluster.wait_for_leader()
    others = [member for member in cluster.members if member.index != leader]
    granted = [
        gateway(others[0].url, "lease/grant", {"TTL": ttl}, timeout=5)["ID"] for _ in range(leases)
    ]
    stop = threading.Event()
    keepers = [Keeper(lease, ttl, others, stop) for lease in granted]
    time.sleep(1)
    cluster.member(leader).pause()
    time.sleep(pause)
    cluster.member(leader).resume()
    resumed = time.monotonic()
    time.sleep(ttl + 2)
    stop.set()
    for keeper in keepers:
        keeper.thread.join()
    for lease in granted:
        with contextlib.suppress(OSError):
            gateway(others[0].url, "lease/revoke", {"ID": lease}, timeout=5)
    early = [
        keeper.lost_at - resumed
        for keeper in keepers
        if keeper.lost_at is not None and keeper.early_by > EARLY_MARGIN
    ]
    lost = sum(keeper.lost_at is not None for keeper in keepers)
    print(
        f"leader m{leader} paused {pause:g} s: {lost} of {leases} leases lost, "
        f"{len(early)} early, found {sorted(round(s, 3) for s in early)} s after SIGCONT",
        flush=True,
    )
    return early


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", help="the etcd to run (default: /usr/bin/etcd)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--pause", type=float, default=7.0, help="seconds the leader is stopped")
    parser.add_argument("--ttl", type=int, default=5, help="each lease's TTL, seconds")
    parser.add_argument("--leases", type=int, default=5)
    args = parser.parse_args(argv)
    cluster = EtcdCluster()
    if args.binary:
        cluster.binary = args.binary
    cluster.start()
    try:
        version = gateway(cluster.endpoints[0], "maintenance/status", {}, timeout=5)["version"]
        print(f"etcd {version}, {args.rounds} rounds", flush=True)
        rounds = [
            one_round(cluster, pause=args.pause, ttl=args.ttl, leases=args.leases)
            for _ in range(args.rounds)
        ]
    finally:
        cluster.destroy()
    early = [seconds for found in rounds for seconds in found]
    latest = f", at most {max(early):.3f} s after the SIGCONT" if early else ""
    print(
        f"leases lost early: {len(early)} of {args.rounds * args.leases}, in "
        f"{sum(bool(found) for found in rounds)} of {args.rounds} rounds{latest}"
    )
    return 1 if early else 0


if __name__ == "__main__":
    raise SystemExit(main())
