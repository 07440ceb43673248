"""``leader_election``: exactly one leader per key across every replica, and the campaign that
``manage.py run_leader`` runs for each key.

A campaign takes the key's lease when it is free, runs the work in a worker thread while the
lease is held (renewed in the background like every lock), and steps down when the work returns
or raises, when the lease is lost, or when the process is told to stop. Followers try again every
``ttl / 3`` and as soon as the store tells them of a release.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import close_old_connections
from django.utils.module_loading import autodiscover_modules

from django_locks import durations, registry
from django_locks.context import running_under
from django_locks.durations import Duration
from django_locks.exceptions import AbortedError, LockLostError, StoreError
from django_locks.holders import Holder, working_on
from django_locks.keys import validate_key
from django_locks.lock import Lock, hand_back
from django_locks.notices import wait_for_release
from django_locks.ownership import LostReason, Term
from django_locks.policy import POLICY
from django_locks.service import Locks

logger = logging.getLogger("django_locks")


@dataclasses.dataclass(frozen=True)
class Election:
    """A registered ``@leader_election``: its key, ttl (``None``: the configured one), work,
    and ``max_hold`` (``None``: none; an election never takes ``LOCKS["MAX_HOLD"]``)."""

    key: str
    ttl_ms: int | None
    target: Any
    name: str
    max_hold_ms: int | None = None

    @property
    def is_class(self) -> bool:
        return inspect.isclass(self.target)


W = TypeVar("W", bound=Callable[..., Any])
"""The decorated work of ``leader_election``: a function or a class, returned as it is."""

_elections: dict[str, Election] = {}
_elections_mutex = threading.Lock()


def leader_election(
    key: str, *, ttl: Duration | None = None, max_hold: Duration | None = None
) -> Callable[[W], W]:
    """Register the decorated work as the leader of ``key``; ``run_leader KEY`` runs it.

    On a function ``def work(lock)`` (or ``async def``): called in a worker thread while this
    process leads; it works until ``lock.signal`` aborts, then returns. Returning or raising
    steps down (the lease is released) and the campaign starts again after a backoff.

    On a class with ``on_leadership_acquired(self, lock)`` and ``on_leadership_lost(self, lock,
    reason)``: instantiated once per process; ``on_leadership_acquired`` is called when leading
    (returning from it does not step down), ``on_leadership_lost`` when the lease is lost
    (``reason="lost"``), handed back (``"released"``) or held for its ``max_hold``
    (``"max_hold"``). Raises ``ImproperlyConfigured`` when another job or election already
    uses ``key``.

    ``max_hold``: a term ends this long after it began (its lease lapses within its ttl,
    recorded as "max hold"; ``leadership_lost`` says ``reason="max_hold"``) and the campaign
    goes on, here and on every replica. Default: none (``LOCKS["MAX_HOLD"]`` is for locks and
    runs, never elections).
    """
    validate_key(key)
    ttl_ms = None if ttl is None else durations.ttl_ms(ttl)
    max_hold_ms = durations.max_hold_ms(max_hold)

    def decorate(target: W) -> W:
        if inspect.isclass(target):
            if not callable(getattr(target, "on_leadership_acquired", None)):
                raise TypeError(
                    f"@leader_election class {target.__qualname__} must define "
                    "on_leadership_acquired(self, lock)"
                )
        elif not callable(target):
            raise TypeError(f"@leader_election needs a function or a class, got {target!r}")
        job = registry.job_for(target, kind="leader_election", key=key)
        registry.claim(job, key)
        with _elections_mutex:
            _elections[key] = Election(key, ttl_ms, target, job.name, max_hold_ms)
        return target

    return decorate


def discover() -> dict[str, Election]:
    """Import every installed app's ``leaders`` module; return the registered elections."""
    autodiscover_modules("leaders")
    with _elections_mutex:
        return dict(sorted(_elections.items()))


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn``; run it to completion on a fresh event loop when it is a coroutine function."""
    result = fn(*args)
    if inspect.isawaitable(result):
        return asyncio.run(_awaited(result))
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class Campaign:
    """One key's campaign in this process (run on its own thread by :func:`run`)."""

    def __init__(
        self,
        election: Election,
        locks: Locks,
        *,
        ttl_ms: int,
        grace: float,
        stopping: threading.Event,
        report: Callable[[str, int], None] = lambda line, level: None,
    ) -> None:
        self.election = election
        self.key = election.key
        self.locks = locks
        self.ttl_ms = ttl_ms
        self.ttl = ttl_ms / 1000
        self.grace = grace
        self.stopping = stopping
        self.report = report
        self.wake = threading.Event()
        self.finished_in_time = True
        self.instance = election.target() if election.is_class else None
        self._failures = 0
        self._leader_seen: str | None = None  # the leader a follower last said it follows
        self._term: Term | None = None  # the current or last term of this process

    def _say(self, line: str, *args: Any, level: int = logging.INFO) -> None:
        logger.log(level, line, *args)
        self.report(line % args, level)

    def run(self) -> None:
        """Campaign until told to stop; an unexpected error ends this campaign, logged, and
        makes ``run_leader`` exit 1 instead of 0."""
        try:
            self._campaign()
        except Exception:
            self.finished_in_time = False
            logger.exception("The campaign for %s failed", self.key)

    def _campaign(self) -> None:
        while not self.stopping.is_set():
            try:
                with working_on(self.key):
                    lock = self.locks._acquire(
                        self.key,
                        self.ttl_ms,
                        0.0,
                        None,
                        self.key,
                        "leader",
                        max_hold_ms=self.election.max_hold_ms,
                    )
            except StoreError as exc:
                self._say("Campaign for %s failed: %s", self.key, exc, level=logging.WARNING)
                self.stopping.wait(POLICY.campaign_every(self.ttl))
                continue
            if not isinstance(lock, Lock):
                self._say_who_leads(lock)
                if self._follow():
                    self._leader_seen = None  # a release: say who leads next
                continue
            self._leader_seen = None
            started = self.locks.clock.monotonic()
            outcome = self._lead(lock)
            if outcome in {"returned", "raised"} and not self.stopping.is_set():
                # No crash loop on one replica: wait longer after each short term.
                short = self.locks.clock.monotonic() - started < self.ttl
                self._failures = self._failures + 1 if short else 0
                self.stopping.wait(POLICY.relaunch_delay(self._failures, self.ttl))

    def _say_who_leads(self, leader: Holder | None) -> None:
        """A follower says whom it follows (as the failed campaign's answer named it): once,
        and again after the leader changed."""
        if self._leader_seen is not None:
            return
        holder = str(leader) if leader is not None else ""
        self._leader_seen = holder
        self._say(
            "Following %s: %s leads; campaigning every %gs and when it lets go",
            self.key,
            holder or "another replica",
            POLICY.campaign_every(self.ttl),
        )

    def _follow(self) -> bool:
        """Wait up to ``ttl / 3`` for the next campaign, woken early by a release notice
        (``True``: woken by one)."""
        give_up = self.locks.clock.monotonic() + POLICY.campaign_every(self.ttl)
        clock = self.locks.clock
        waited = wait_for_release(
            self.locks.store,
            self.locks.key_prefix + self.key,  # the store's name of the key
            give_up,
            stop=self.stopping,
            monotonic=clock.monotonic,
        )
        return waited == "released"

    def _lead(self, lock: Lock) -> str:
        self._say("Leading %s (fencing token %s)", self.key, lock.fencing_token)
        self._term = Term(self.key, lock)
        self.wake.clear()
        lock.signal.add_callback(lambda _: self.wake.set())
        outcome: dict[str, Any] = {}
        # A daemon: work that overstays the grace must not keep run_leader from exiting (its
        # lease is released by then, so another replica's term starts).
        worker = threading.Thread(
            target=self._work,
            args=(lock, outcome),
            name=f"django_locks-leader:{self.key}",
            daemon=True,
        )
        try:
            worker.start()
            while True:
                if self.stopping.is_set():
                    return self._shut_down(lock, worker)
                if lock.signal.aborted:
                    return self._lost(lock, worker)
                if "done" in outcome and (not self.election.is_class or "error" in outcome):
                    ended = "raised" if "error" in outcome else "returned"
                    return self._step_down(lock, worker, ended)
                self.wake.wait(1.0)
                self.wake.clear()
        except BaseException:
            # Whatever failed here (a report to a closed stdout, a thread that cannot start),
            # the term ends: the work is told, the lease handed back, the end announced.
            if lock.held:
                self.finished_in_time = False
                lock.signal.abort(AbortedError(f"the campaign for {self.key} failed"))
                if worker.is_alive():
                    worker.join(self.grace)
                self._release(lock)
                try:
                    self._ended(lock, "released")
                except Exception:
                    logger.exception("Announcing the end of the term of %s failed", self.key)
            raise

    def _work(self, lock: Lock, outcome: dict[str, Any]) -> None:
        close_old_connections()
        try:
            with running_under(lock):
                if self.instance is not None:
                    _call(self.instance.on_leadership_acquired, lock)
                else:
                    _call(self.election.target, lock)
        except BaseException as exc:
            outcome["error"] = exc
            logger.exception("The work of leader %s raised", self.key)
        finally:
            close_old_connections()
            outcome["done"] = True
            self.wake.set()

    def _lost(self, lock: Lock, worker: threading.Thread) -> str:
        reason = lock.signal.reason
        capped = isinstance(reason, LockLostError) and reason.detected_by == "max_hold"
        if capped:
            self._say(
                "The term of %s reached its max_hold (fencing token %s): stepping down",
                self.key,
                lock.fencing_token,
            )
        elif isinstance(reason, LockLostError):
            self._say(
                "Lost the leadership of %s (fencing token %s, detected by %s)",
                self.key,
                lock.fencing_token,
                reason.detected_by,
                level=logging.WARNING,
            )
        self._ended(lock, "max_hold" if capped else "lost")
        # The work was told through lock.signal; never run two terms' work at once.
        while worker.is_alive() and not self.stopping.is_set():
            worker.join(self.ttl)
            if worker.is_alive():
                logger.warning("The work of leader %s still runs after losing it", self.key)
        if worker.is_alive():
            worker.join(self.grace)
            self.finished_in_time = not worker.is_alive()
        return "lost"

    def _step_down(self, lock: Lock, worker: threading.Thread, outcome: str) -> str:
        worker.join()
        self._release(lock)
        self._ended(lock, "released")
        return outcome

    def _shut_down(self, lock: Lock, worker: threading.Thread) -> str:
        lock.signal.abort(AbortedError(f"run_leader is stopping: {self.key} is handed back"))
        worker.join(self.grace)
        self.finished_in_time = not worker.is_alive()
        if not self.finished_in_time:
            self._say(
                "The work of %s did not return within the %gs grace period",
                self.key,
                self.grace,
                level=logging.ERROR,
            )
        self._release(lock)
        self._ended(lock, "released")
        return "stopped"

    def _release(self, lock: Lock) -> None:
        try:
            hand_back(lock)
        except StoreError as exc:
            self._say(
                "Releasing %s failed (%s); it lapses within its ttl",
                self.key,
                exc,
                level=logging.WARNING,
            )

    def _ended(self, lock: Lock, reason: LostReason) -> None:
        on_lost = getattr(self.instance, "on_leadership_lost", None)
        if callable(on_lost):
            try:
                _call(on_lost, lock, reason)
            except Exception:
                logger.exception("on_leadership_lost of %s raised", self.key)
        term = self._term
        if term is not None and term.lock is lock:
            term.end(reason)
        self._say("Stepped down from %s (%s)", self.key, reason)


def run(
    keys: list[str],
    *,
    locks: Locks,
    ttl_ms: int | None,
    grace: float,
    stopping: threading.Event,
    report: Callable[[str, int], None] = lambda line, level: None,
) -> int:
    """Campaign for every key of ``keys`` until ``stopping`` is set; return the exit code
    (0, or 1 when some work did not return within ``grace`` of the stop or a campaign failed)."""
    elections = discover()
    campaigns = [
        Campaign(
            elections[key],
            locks,
            ttl_ms=ttl_ms or elections[key].ttl_ms or locks.ttl_ms,
            grace=grace,
            stopping=stopping,
            report=report,
        )
        for key in keys
    ]
    threads = [
        threading.Thread(target=c.run, name=f"django_locks-campaign:{c.key}", daemon=True)
        for c in campaigns
    ]
    for thread in threads:
        thread.start()
    while not stopping.wait(0.5):
        if not any(thread.is_alive() for thread in threads):
            break
    for campaign in campaigns:
        campaign.wake.set()
    for thread in threads:
        thread.join()
    return 0 if all(c.finished_in_time for c in campaigns) else 1
