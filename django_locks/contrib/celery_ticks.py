"""Missed ticks (SPEC section 12): what a standby beat saw skipped, and what it does on taking
an entry over.

A standby beat calls ``apply_entry`` at each of its own due ticks like the owner does, and skips
the entry while another beat holds its owner lease. :class:`MissedTicks` remembers those ticks
and who held the lease. Once that lease should have expired it tries to take it over (from the
scheduler's wrapped ``tick()``, without waiting for the entry's next due tick); when it does,
the ticks it skipped that its predecessor never published are reported (one WARNING, and
``run_skipped(code="missed")`` for each), and for a ``catch_up=True`` entry the latest of them
is recorded and published once.

What the predecessor published is read from the tick record of a ``catch_up`` entry: every tick
is recorded before it is published, so a skipped tick later than the record was not published
(and the record's own tick maybe not, when the predecessor stopped right after recording it).
Without a record, the ticks skipped after the predecessor's last renewal are reported: it was
alive then, and nothing says whether it lived to publish what came after.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_locks.exceptions import LocksError
from django_locks.holders import Holder
from django_locks.job import JobSpec
from django_locks.lock import Lock
from django_locks.ownership import MISSED, skipped
from django_locks.policy import POLICY
from django_locks.stores.base import TickRecord

if TYPE_CHECKING:
    from django_locks.contrib.celery_beat import BeatGuard

logger = logging.getLogger("django_locks")

MAX_WATCHED = 100
"""Skipped ticks remembered per entry (the latest): a nightly job needs one."""
DEFAULT_PERIOD = 60.0
"""The period assumed for an entry whose schedule names none and whose ticks this beat has not
seen twice (a crontab's shortest): half of it is the tolerance between two beats' instants of
one tick."""


@dataclasses.dataclass
class Watched:
    """An entry whose ticks this beat skipped because another beat held its owner lease."""

    key: str
    entry: Any
    spec: JobSpec
    label: str
    holder: Holder | None
    ticks: list[float]  # this beat's skipped ticks, wall-clock seconds
    check_at: float  # monotonic: when to try taking the lease over
    ttl: float  # the owner lease's, seconds
    misses: int = 0  # checks that found no holder to wait for


def _when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%H:%M:%S UTC")


def _epoch(moment: datetime.datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


class MissedTicks:
    """The entries one beat watches for missed ticks (its :class:`BeatGuard`'s)."""

    def __init__(self, guard: BeatGuard) -> None:
        self.guard = guard
        self.watched: dict[str, Watched] = {}
        self.monotonic: Callable[[], float] = time.monotonic
        self.wall: Callable[[], float] = time.time

    def skipped(
        self, key: str, entry: Any, spec: JobSpec, label: str, holder: Holder | None
    ) -> None:
        """At one of this beat's due ticks, skipped: ``holder`` (None: the store did not say)
        holds the entry's owner lease."""
        now = self.wall()
        ttl = self.ttl(spec)
        watched = self.watched.get(key)
        if watched is None or _other(watched.holder, holder):
            watched = Watched(key, entry, spec, label, holder, [], 0.0, ttl)
            self.watched[key] = watched
        watched.entry, watched.holder = entry, holder
        watched.ticks = [*self.alive_after(watched), now][-MAX_WATCHED:]
        watched.check_at = self.check_time(holder, ttl)

    def ttl(self, spec: JobSpec) -> float:
        assert spec.once is not None
        ttl_ms = spec.once.ttl_ms
        return (self.guard.locks.ttl_ms if ttl_ms is None else ttl_ms) / 1000

    def alive_after(self, watched: Watched) -> list[float]:
        """The skipped ticks the holder may not have published: those later than its last
        renewal less :meth:`slack` (it was alive then, so the ticks before were its to publish
        while it was)."""
        since = self.alive_until(watched)
        return [t for t in watched.ticks if t > since]

    def alive_until(self, watched: Watched) -> float:
        """Up to when the holder's own tick for one of this beat's was surely its to publish:
        its last renewal, less the slack of ticks that fall at other instants on each beat."""
        renewed = _renewed(watched.holder, watched.ttl)
        return float("-inf") if renewed is None else renewed - self.slack(watched.entry)

    def slack(self, entry: Any) -> float:
        """Half the period of an interval schedule, which each beat times from its own start
        (this beat's tick and the holder's for it are up to that far apart); 0 for schedules
        that fall at the same instants on every beat (crontab, solar)."""
        run_every = getattr(getattr(entry, "schedule", None), "run_every", None)
        return run_every.total_seconds() / 2 if isinstance(run_every, datetime.timedelta) else 0.0

    def check_time(self, holder: Holder | None, ttl: float) -> float:
        """When to try taking over the lease ``holder`` holds: just after it expires unless
        renewed (in at most one ttl when the store did not say when)."""
        expires = _epoch(holder.expires_at) if holder is not None else None
        wait = ttl if expires is None else min(max(expires - self.wall(), 0.0), ttl)
        return self.monotonic() + wait + POLICY.takeover_margin

    def due(self) -> float | None:
        """Seconds until the next check (None: nothing watched)."""
        if not self.watched:
            return None
        return max(min(w.check_at for w in self.watched.values()) - self.monotonic(), 0.0)

    def check(self) -> None:
        """Try taking over each watched lease whose holder should have stopped by now."""
        now = self.monotonic()
        for watched in [w for w in self.watched.values() if w.check_at <= now]:
            try:
                self.check_one(watched)
            except LocksError as exc:
                watched.check_at = now + POLICY.campaign_every(watched.ttl)
                logger.warning(
                    "Could not check whether %r was handed over (the lock store failed: %s); "
                    "checked again in %.1fs",
                    watched.key,
                    exc,
                    POLICY.campaign_every(watched.ttl),
                )

    def check_one(self, watched: Watched) -> None:
        guard = self.guard
        if guard.leader_mode and not guard.lead():
            watched.check_at = self.monotonic() + POLICY.campaign_every(watched.ttl)
            return
        found = guard.owner_lease(watched.key, watched.spec, watched.label)
        if isinstance(found, Lock):
            self.took(watched.key, found, watched.entry, watched.spec)
            return
        if found is None:
            watched.misses += 1
        elif not _other(watched.holder, found):
            watched.holder = found
        else:
            self.watched.pop(watched.key, None)  # another took over: its report, not ours
            return
        watched.ticks = self.alive_after(watched)
        if not watched.ticks or watched.misses > 1:
            self.watched.pop(watched.key, None)  # it lives on: it published them
            return
        watched.check_at = max(self.check_time(found, watched.ttl), self.monotonic() + 0.1)

    def took(
        self, key: str, lock: Lock, entry: Any, spec: JobSpec, now: float | None = None
    ) -> bool:
        """This beat just took ``key`` over: report (and catch up) what its predecessor missed.
        ``now``: the due tick this beat is about to publish (None: taken between ticks).
        Answers whether the record says the predecessor published that tick already (beats
        whose interval schedules tick at different instants: one tick, not two). A store
        failure here publishes nothing late (never twice): the ticks are reported."""
        watched = self.watched.pop(key, None)
        assert spec.once is not None
        catch_up = spec.once.catch_up and self.guard.locks.store.supports_ticks
        if watched is None and (not catch_up or now is None):
            return False
        record = self.read_record(key) if catch_up else None
        if record is not None and record.fencing_token == lock.fencing_token:
            return False  # this beat's own record: nothing was handed over
        half = self.period(entry, watched.ticks if watched is not None else []) / 2
        recorded = None if record is None else record.tick_ms / 1000
        if watched is not None:
            if recorded is not None:
                self.maybe_unpublished(watched, recorded)
                since = recorded + half
            else:
                since = self.alive_until(watched)
            self.settle([t for t in watched.ticks if t > since], watched, lock, catch_up, record)
        return now is not None and recorded is not None and now - recorded < half

    def settle(
        self,
        missed: list[float],
        watched: Watched,
        lock: Lock,
        catch_up: bool,
        record: TickRecord | None,
    ) -> None:
        """Report the ticks ``missed``; with a record, publish the latest once (recorded
        first)."""
        if not missed:
            return
        published = None
        latest = round(missed[-1] * 1000) / 1000  # as the record holds it, to the millisecond
        if catch_up and record is not None and self.record(lock, latest):
            published = latest
            missed = [*missed[:-1], latest]
        self.report(watched, missed, published, record is not None)
        for _tick in (t for t in missed if t != published):
            skipped(
                watched.entry.task,
                watched.key,
                MISSED,
                holder=watched.holder,
                level=logging.DEBUG,
                label=watched.label,
            )
        if published is not None:
            self.guard.publish(watched.entry, None, watched.key, lock, published, catch_up=True)

    def read_record(self, key: str) -> TickRecord | None:
        try:
            record: TickRecord | None = self.guard.locks._recorded_tick(key)
        except LocksError as exc:
            logger.warning(
                "Could not read the tick record of %r (the lock store failed: %s): its missed "
                "ticks are reported from its lease, and none is published late",
                key,
                exc,
            )
            return None
        return record

    def record(self, lock: Lock, tick: float) -> bool:
        try:
            return self.guard.record_tick(lock, round(tick * 1000))
        except LocksError as exc:
            logger.warning(
                "Could not record the missed tick due %s of %r (the lock store failed: %s): it "
                "is not published late",
                _when(tick),
                lock.key,
                exc,
            )
            return False

    def period(self, entry: Any, ticks: list[float]) -> float:
        """The entry's period: its schedule's ``run_every``, else the shortest gap between the
        ticks this beat saw, else :data:`DEFAULT_PERIOD`."""
        run_every = getattr(getattr(entry, "schedule", None), "run_every", None)
        if isinstance(run_every, datetime.timedelta):
            return run_every.total_seconds()
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        return min(gaps) if gaps else DEFAULT_PERIOD

    def maybe_unpublished(self, watched: Watched, recorded: float) -> None:
        """Log the record's own tick when the predecessor stopped right after recording it."""
        renewed = _renewed(watched.holder, watched.ttl)
        if renewed is not None and renewed > recorded + POLICY.publish_window(watched.ttl):
            return  # it lived well past publishing it
        logger.warning(
            "Beat entry %r (task %r): its tick due %s was recorded, maybe not published: the "
            "beat that held %r (%s) stopped renewing before it renewed again after recording "
            "it, so it may have died between the record and the publish (a moment) or after "
            "both. It is not published again. Look for a run with "
            "django_locks_scheduled %s (the task's self.request.django_locks_scheduled; the "
            "worker logs it at DEBUG on the django_locks logger); if there is none, run it by "
            "hand.",
            _name(watched.entry),
            watched.entry.task,
            _when(recorded),
            watched.key,
            watched.holder,
            datetime.datetime.fromtimestamp(recorded, datetime.UTC).isoformat(),
        )

    def report(
        self, watched: Watched, missed: list[float], published: float | None, recorded: bool
    ) -> None:
        """The one WARNING naming the missed ticks, and what became of them."""
        assert watched.spec.once is not None
        due = ", ".join(_when(t) for t in missed)
        one = len(missed) == 1
        if published is not None:
            outcome = f"the latest, due {_when(published)}, is published now, late (catch_up=True)"
        elif recorded:
            outcome = "none is published late (the store did not take its record)"
        elif watched.spec.once.catch_up:
            outcome = (
                f"{'it is' if one else 'they are'} not published late: the tick record could "
                "not be read (catch_up needs a store that records ticks)"
            )
        else:
            outcome = (
                f"{'it is' if one else 'they are'} not published late: with "
                "on_one_instance(catch_up=True) each published tick is recorded, and the beat "
                "taking over publishes the latest missed one"
            )
        if recorded:
            what = f"{'was' if one else 'were'} missed (later than the last tick recorded)"
            why = "after recording an earlier tick"
        else:
            what = f"may not have been published (nothing recorded {'it' if one else 'them'})"
            why = _last_renewal(watched)
        logger.warning(
            "Beat entry %r (task %r): %d tick%s due %s %s: the beat that held %r (%s) stopped "
            "renewing %s; %s.",
            _name(watched.entry),
            watched.entry.task,
            len(missed),
            "" if one else "s",
            due,
            what,
            watched.key,
            watched.holder,
            why,
            outcome,
        )


def _name(entry: Any) -> str:
    return str(getattr(entry, "name", None) or entry.task)


def _renewed(holder: Holder | None, ttl: float) -> float | None:
    """When ``holder`` last renewed its lease (its expiry less the ttl), wall-clock seconds."""
    expires = _epoch(holder.expires_at) if holder is not None else None
    return None if expires is None else expires - ttl


def _last_renewal(watched: Watched) -> str:
    renewed = _renewed(watched.holder, watched.ttl)
    if renewed is None:
        return "its lease"
    return f"its lease after {_when(renewed)}; the ticks this beat skipped since then are reported"


def _other(seen: Holder | None, found: Holder | None) -> bool:
    """Whether ``found`` is another holder than ``seen`` (another take of the lease)."""
    if seen is None or found is None:
        return False
    return (seen.address, seen.since) != (found.address, found.since)
