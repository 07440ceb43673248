"""``RenewalPolicy``: every figure of renewal, holder deadlines, call timeouts and retry delays."""

from __future__ import annotations

import dataclasses
import math
import random

# Imports nothing of the package: every module that times a lock reads this one.

DRIFT = 0.01
"""The largest rate difference assumed between the holder's clock and the store's (1%)."""

MARGIN = 0.005
"""Seconds taken off every deadline for scheduling latency (5 ms)."""

MIN_CALL_TIMEOUT = 0.05
"""The shortest timeout of a lock's store call (SPEC section 10): a release or a leave is
bounded by the lock's remaining validity, but never below 50 ms, so that a call made at the end
of the validity still has the time of a round trip."""

MIN_TTL_MS = 50
"""The shortest ttl a lock may have: its holder deadline keeps a margin, and it renews every
ttl / 3."""


@dataclasses.dataclass(frozen=True, slots=True)
class RenewalPolicy:
    """The figures that time a held lock and the retries around it (package-internal).

    Ttl fractions are divisors (``ttl / 3``, never ``ttl * (1 / 3)``): the same floats as the
    formulas they replaced, to the last bit. ``docs/internals/policy.rst`` says why each is what
    it is.
    """

    drift: float = DRIFT
    margin: float = MARGIN
    min_call_timeout: float = MIN_CALL_TIMEOUT
    min_ttl_ms: int = MIN_TTL_MS
    renew_divisor: int = 3
    """A lock is renewed every ttl / 3: two renewals can fail before its deadline."""
    lookahead_divisor: int = 6
    """A batch round takes along every lock whose renewal falls due within ttl / 6."""
    retry_divisor: int = 10
    retry_max: float = 1.0
    """A failed renewal is retried after ttl / 10, or one second if that is sooner."""
    min_renew_timeout: float = 0.001
    """A renewal sent at its deadline still gets a (1 ms) timeout: the store answers, or not."""
    leave_poll: float = 0.002
    """Seconds between looks at a renewal in flight that a leave waits out."""
    acquire_first: float = 0.025
    acquire_cap: float = 1.0
    """A waiting acquire's pauses: 25 ms, doubled each try up to 1 s (jittered)."""
    head_start_min: float = 0.01
    head_start_max: float = 0.04
    """A wait for a release notice on Redis that ran out waits 10 to 40 ms more (drawn at
    random) before it returns: Redis ends a timed-out BLPOP on its timer tick (every 100 ms at
    its default hz), so waits run out together, often at the instant of a release, and the
    waiter the release's notice woke would race them for what it was told of."""
    campaign_divisor: int = 3
    """A follower campaigns every ttl / 3; a campaign failing on a store error waits as long."""
    relaunch_first_max: float = 1.0
    """After a short term the campaign waits min(1 s, ttl / 3), doubled each short term up to
    the ttl (jittered): no crash loop on one replica."""

    exec_grace_max: float = 8.0
    exec_grace_divisor: int = 3
    """``run_leader --exec``: the supervisor sends SIGTERM at the holder deadline minus the grace,
    at most ttl / 3 (a healthy lease is renewed every ttl / 3, so only a lease whose renewals
    failed for two thirds of its ttl reaches it); the default is min(8 s, ttl / 3): below
    Docker's 10 s stop timeout."""
    exec_restart_first: float = 0.5
    exec_restart_cap: float = 60.0
    exec_restart_allowance: float = 1.0
    """``run_leader --exec``: after COMMAND exits, the instance waits 0.5 s before campaigning
    again, then 2 s, 5 s, 11 s, 23 s, 47 s, up to 60 s (``--restart-cap``), without jitter: each
    wait plus 1 s doubles the last one's, so the intervals between restarts (a wait and the
    restart itself: the campaign, the supervisor's and COMMAND's start, up to half a second on
    a loaded machine) at least double. A COMMAND that ran at least as long as the cap starts
    the count again."""

    task_retry_max: float = 600.0
    """The longest wait before a task's retry (``on_conflict="retry"``): 10 minutes."""
    takeover_margin: float = 0.05
    """A standby beat tries to take over a lease it skipped ticks for 50 ms after the lease
    should have expired (missed ticks)."""
    publish_window_max: float = 1.0
    publish_window_divisor: int = 10
    """A beat publishes a tick within min(1 s, ttl / 10) of recording it: a predecessor that
    renewed later than that after its record lived to publish it."""

    etcd_watch_connect: float = 2.0
    etcd_watch_read: float = 10.0
    """The etcd store's watch connects within 2 s and is made again (from its next revision:
    nothing is missed) after 10 s without a line, so a stream a dead member or a hung route
    left open is noticed within 10 s."""
    etcd_watch_first: float = 0.1
    etcd_watch_cap: float = 5.0
    """A failed etcd watch is made again after 0.1 s, then backing off to 5 s."""
    etcd_attempt: float = 1.0
    """An etcd call that may be repeated (acquire, every call of a renewal, a lease grant or
    keepalive) waits 1 s for one member, then is sent again to the next, until its deadline: a
    member without a leader holds a write for etcd's 7 s request timeout, longer than a short
    lock has left, and a new leader is elected in 1 to 2.5 s."""
    etcd_heartbeat_wait: float = 1.0
    """The longest wait of ``EtcdStore.renew_many`` for its watch to see its heartbeat before
    it reads its keys instead."""

    def period(self, ttl: float) -> float:
        """Seconds from a renewal's send (or the acquire's) to the next renewal."""
        return ttl / self.renew_divisor

    def deadline(self, sent: float, ttl: float) -> float:
        """The holder deadline of a lease the store confirmed, counted from its ``sent`` time."""
        return sent + ttl * (1 - self.drift) - self.margin

    def acquire_timeout(self, ttl_ms: int) -> float:
        """An acquire may take no longer than the lease it asks for would be valid."""
        return ttl_ms / 1000 * (1 - self.drift) - self.margin

    def renew_timeout(self, deadline: float, sent: float) -> float:
        """A renewal sent at ``sent`` may take until the earliest deadline it must keep."""
        return max(deadline - sent, self.min_renew_timeout)

    def call_timeout(self, deadline: float, now: float) -> float:
        """A release's or a leave's timeout: the lock's remaining validity, at least
        ``min_call_timeout``."""
        return max(deadline - now, self.min_call_timeout)

    def lookahead(self, ttl: float) -> float:
        """A batch renewing now takes along a lock whose renewal falls due this soon."""
        return ttl / self.lookahead_divisor

    def etcd_election_ttl(self, min_lease_ttl_s: int) -> int:
        """The shortest ttl (whole seconds) whose renewals ride out an etcd leader election: a
        leader change takes up to about two election timeouts (the cluster's minimum lease TTL
        is about 1.5 of them), a renewal sent then is answered one attempt later, and a
        renewal has two thirds of its ttl before its deadline. 6 s with etcd's defaults."""
        election = 2 * min_lease_ttl_s / 1.5
        return math.ceil((election + self.etcd_attempt) * self.renew_divisor / 2)

    def retry(self, ttl: float) -> float:
        """Seconds before a failed renewal is sent again."""
        return min(ttl / self.retry_divisor, self.retry_max)

    def campaign_every(self, ttl: float) -> float:
        """A follower's wait between campaigns, and a failed campaign's."""
        return ttl / self.campaign_divisor

    def relaunch_delay(self, failures: int, ttl: float) -> float:
        """The campaign's wait after a term that returned or raised, ``failures`` short terms
        in a row (0: the last was not short)."""
        first = min(self.relaunch_first_max, ttl / self.campaign_divisor)
        return self.backoff(max(failures - 1, 0), cap=ttl, first=first)

    def exec_max_grace(self, ttl: float) -> float:
        """The longest ``--grace`` of ``run_leader --exec`` for a lease of ``ttl`` seconds."""
        return ttl / self.exec_grace_divisor

    def exec_grace(self, ttl: float) -> float:
        """The default ``--grace`` of ``run_leader --exec``."""
        return min(self.exec_grace_max, self.exec_max_grace(ttl))

    def exec_restart_delay(self, exits: int, cap: float) -> float:
        """Seconds before campaigning again after COMMAND's ``exits``-th exit in a row (1, 2,
        ...): ``exec_restart_first`` plus the restart allowance, doubled each time, less the
        allowance (0.5, 2, 5, 11 s...), at most ``cap``; no jitter."""
        allowance = self.exec_restart_allowance
        first = min(self.exec_restart_first, cap) + allowance
        grown = self.backoff(max(exits - 1, 0), cap=cap + allowance, first=first, jitter=False)
        return cap if grown >= cap + allowance else grown - allowance

    def replace_wait(self, ttl: float) -> float:
        """A replacing run's default wait for the key (``on_conflict="replace"``): the holder
        reads the request with its next renewal (within a period), and the lease of one that
        ignores its signal lapses at most a ttl after its last renewal."""
        return ttl + self.period(ttl)

    def task_retry_delay(self, retries: int, ttl: float) -> float:
        """Seconds before a task's retry number ``retries + 1`` (``on_conflict="retry"``): a
        renewal period doubled at each retry, at most ``task_retry_max`` (jittered)."""
        return self.backoff(retries, cap=self.task_retry_max, first=self.period(ttl))

    def publish_window(self, ttl: float) -> float:
        """Seconds within which a beat publishes a tick it recorded (above)."""
        return min(self.publish_window_max, ttl / self.publish_window_divisor)

    def etcd_watch_retry(self, failures: int) -> float:
        """The wait before the etcd watch is made again, after ``failures`` in a row."""
        return self.backoff(
            max(failures - 1, 0), cap=self.etcd_watch_cap, first=self.etcd_watch_first
        )

    def head_start(self) -> float:
        """Seconds a Redis wait for a release notice that ran out waits more (above)."""
        return random.uniform(self.head_start_min, self.head_start_max)

    def backoff(
        self,
        attempt: int,
        cap: float | None = None,
        first: float | None = None,
        *,
        jitter: bool = True,
    ) -> float:
        """The one capped exponential backoff: ``first * 2 ** attempt`` seconds at most ``cap``,
        drawn at random from its upper half (``jitter``, the default; else that figure itself).
        Defaults: a waiting acquire's figures.

        Any ``attempt`` (a wait of days makes millions): past a float's range it is ``cap``.
        """
        cap = self.acquire_cap if cap is None else cap
        first = self.acquire_first if first is None else first
        try:
            # ldexp is first * 2 ** attempt exactly, and raises instead of building a huge int.
            delay = min(cap, math.ldexp(first, max(attempt, 0)))
        except OverflowError:
            delay = cap
        return random.uniform(delay / 2, delay) if jitter else delay


POLICY = RenewalPolicy()
"""The policy every lock, batch and campaign of this process reads."""
