"""Celery beat's side: ``BeatGuard`` publishes only what is this beat's, with beat's headers.

When a beat starts (``beat_init``, sent by ``celery beat`` and by ``worker -B`` alike), a
:class:`BeatGuard` wraps its scheduler *instance*'s ``apply_entry``, ``close`` and ``tick``,
whatever the scheduler class: owner leases of ``on_one_instance`` tasks, missed ticks, the
whole-beat leader mode. ``django_locks.contrib.celery`` connects the signals.
"""

from __future__ import annotations

import contextvars
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

from django_locks import process
from django_locks.contrib.celery_ticks import MissedTicks
from django_locks.exceptions import LocksError
from django_locks.holders import Holder
from django_locks.job import OWNER_SUFFIX, JobSpec, job_spec
from django_locks.keys import MAX_KEY_LENGTH
from django_locks.lock import Lock
from django_locks.ownership import ELSEWHERE, OwnerLeases, Term, skipped

logger = logging.getLogger("django_locks")

HEADER_KEY = "django_locks_key"
"""The owner lease (or leader lease) under which beat published the message."""
HEADER_TOKEN = "django_locks_token"
"""That lease's fencing token."""
HEADER_SCHEDULED = "django_locks_scheduled"
"""When beat published the tick (ISO 8601, UTC)."""
HEADER_BEAT = "django_locks_beat"
"""The beat process that published it, ``host:pid``."""
HEADER_CATCH_UP = "django_locks_catch_up"
"""``"1"`` on a missed tick published late by the beat that took its entry over (``catch_up``)."""

HANDBACK_GRACE = 1.0
"""Seconds a stopping beat keeps a lease after it last published under it. Every beat wakes for
the same crontab tick within a few milliseconds of the others: a lease handed back at once, right
after publishing, lets a beat waking a moment later publish that same tick again."""

REFUSAL_REPEAT = 600
"""Seconds between two ERROR lines about one beat entry refused with the same error."""

_publishing: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "django_locks_beat_headers", default=None
)


def task_spec(task: Any) -> JobSpec | None:
    """The :class:`JobSpec` of a Celery task's body, or None when it is not decorated."""
    return job_spec(getattr(task, "run", None))


def on_beat_init(sender: Any, **kwargs: Any) -> None:
    """``beat_init``: wrap the scheduler instance, report what beat cannot see."""
    scheduler = sender.scheduler
    if getattr(scheduler, "_django_locks_guard", None) is not None:
        return
    guard = BeatGuard(scheduler)
    scheduler._django_locks_guard = guard
    # The guard is in place: whatever fails below, each entry is still decided at its tick.
    guard.report()
    if guard.leader_mode:
        try:
            guard.lead()
        except Exception:
            logger.exception(
                "This beat (%s) could not campaign for %r at start; it campaigns again at the "
                "next due entry",
                guard.holder,
                guard.leader_key,
            )


def _entry_name(entry: Any) -> str:
    """A beat entry's name (its task's when it has none)."""
    return str(getattr(entry, "name", None) or getattr(entry, "task", None) or entry)


class BeatGuard:
    """The leases one beat holds, and the wrappers of its scheduler's ``apply_entry``/``close``."""

    def __init__(self, scheduler: Any) -> None:
        from django_locks import conf

        self.scheduler = scheduler
        self.app = scheduler.app
        self.leader_mode = conf.get().celery_beat_leader
        self.leader_key = f"celery-beat:{self.app.main or 'celery'}"
        self.term: Term | None = None  # this beat's lead (leader mode)
        self.leases = OwnerLeases(handed_back=_handed_back)
        self.published: dict[str, float] = {}  # lease key -> when this beat last published
        self.refused: dict[str, tuple[str, float]] = {}  # entry -> (its error, when logged)
        self.now: Callable[[], float] = time.monotonic  # when refusals were logged
        self.holder = process.holder()
        self.missed = MissedTicks(self)
        self._apply_entry = scheduler.apply_entry
        self._close = scheduler.close
        self._tick = getattr(scheduler, "tick", None)  # every Celery scheduler has one
        scheduler.apply_entry = self.apply_entry
        scheduler.close = self.close
        if self._tick is not None:
            scheduler.tick = self.tick

    @property
    def owned(self) -> dict[str, Lock]:
        """This beat's owner leases, by key (its :class:`OwnerLeases`' own dict)."""
        return self.leases.by_key

    @owned.setter
    def owned(self, by_key: dict[str, Lock]) -> None:
        self.leases.by_key = by_key

    @property
    def locks(self) -> Any:
        from django_locks.service import locks

        return locks

    def report(self) -> None:
        """Log, at beat start, the entries beat enforces and those it cannot see."""
        try:
            entries = dict(self.scheduler.schedule)
        except Exception:
            logger.exception("django_locks could not read the beat schedule")
            return
        for name, entry in sorted(entries.items()):
            try:
                self.report_entry(name, entry)
            except Exception:
                # One entry that cannot be looked at says so; the others are still reported.
                logger.exception(
                    "django_locks could not look at beat entry %r; it is decided at each tick "
                    "(and refused, with the reason, while that fails)",
                    name,
                )
        if self.leader_mode:
            logger.info(
                "CELERY_BEAT_LEADER: this beat (%s) publishes only while it leads %r",
                self.holder,
                self.leader_key,
            )

    def report_entry(self, name: str, entry: Any) -> None:
        """Log, at beat start, whether beat enforces one entry or cannot see its task."""
        task = self.app.tasks.get(entry.task)
        if task is None:
            if entry.task.startswith("celery."):
                return
            logger.warning(
                "Beat entry %r names task %r, which this beat process has not imported: "
                "django_locks cannot see whether it is decorated with on_one_instance, so "
                "every beat replica publishes it. Make beat import the task's module "
                "(app.autodiscover_tasks() or the imports setting).",
                name,
                entry.task,
            )
            return
        spec = task_spec(task)
        if spec is not None and spec.default_key != task.name:
            # Its default key is the task's name: claim it (refusing another job's).
            spec.claim(default=task.name)
        if spec is not None and spec.once is not None:
            logger.info(
                "Beat entry %r: task %r is published by the beat holding %r",
                name,
                entry.task,
                spec.owner_template(task.name) + OWNER_SUFFIX,
            )
            if spec.once.catch_up and not self.locks.store.supports_ticks:
                logger.warning(
                    "Beat entry %r: task %r has catch_up=True, but the store %s (%s.%s) does "
                    "not record ticks (an optional capability of the store contract): its "
                    "missed ticks are reported, never published late. Configure a store that "
                    "records them: DatabaseStore, RedisStore or InMemoryStore, or a custom "
                    "store with supports_ticks.",
                    name,
                    entry.task,
                    self.locks.store,
                    type(self.locks.store).__module__,
                    type(self.locks.store).__qualname__,
                )

    def lead(self) -> bool:
        """Whether this beat leads; campaign (one store call) when it does not."""
        term = self.term
        if term is not None and term.lock.held:
            return True
        if term is not None:
            self.term = None
            logger.warning(
                "This beat (%s) lost the lead of %r (fencing token %s): it stops publishing and "
                "campaigns again",
                self.holder,
                self.leader_key,
                term.fencing_token,
            )
            term.end("lost")
        locks = self.locks
        found = locks._acquire(self.leader_key, locks.ttl_ms, 0.0, None, self.leader_key, "leader")
        if not isinstance(found, Lock):
            return False
        lock = found
        logger.info(
            "This beat (%s) leads %r: it publishes every entry (fencing token %s)",
            self.holder,
            self.leader_key,
            lock.fencing_token,
        )
        self.term = Term(self.leader_key, lock)
        return True

    def owner_lease(self, key: str, spec: JobSpec, label: str) -> Lock | Holder | None:
        """This beat's owner lease on ``key``: kept (no store call) or taken, else who holds
        it (``None`` when the store cannot say). ``label``: the key template's."""
        assert spec.once is not None
        name = spec.name if spec.once.key else key[: -len(OWNER_SUFFIX)]
        return self.leases.take(name, key, spec.once.ttl_ms, label, spec.once.max_hold_ms)

    def apply_entry(self, entry: Any, producer: Any = None) -> Any:
        """Publish ``entry`` only where it is this beat's to publish, with our headers.

        Nothing one entry holds can stop beat: an entry whose owner lease key cannot be rendered,
        whose task cannot be looked at, or that fails in any other way before it is published is
        refused on its own (not published this tick, see :meth:`refuse`); a store that does not
        answer refuses the entry too (never fail open). Every other entry goes on.
        """
        name = _entry_name(entry)
        headers: dict[str, Any] = {}
        scheduled: float | None = None
        try:
            if self.leader_mode:
                if not self.lead():
                    logger.debug("Skipped %s: this beat is on standby", entry.task)
                    return None
                headers = {HEADER_KEY: self.leader_key, HEADER_TOKEN: self.leader_token()}
            task = self.app.tasks.get(entry.task)
            spec = task_spec(task) if task is not None else None
            if spec is not None and spec.once is not None:
                try:
                    key = self.entry_key(task, spec, entry)
                except Exception as exc:
                    self.refuse(
                        name,
                        entry,
                        exc,
                        f"its arguments render no valid on_one_instance key "
                        f"(template {spec.owner_template(task.name)!r})",
                        "give the entry arguments that fit the task and render a key of 1 to "
                        f"{MAX_KEY_LENGTH} characters with ':owner' appended, or change the key "
                        "template (a long argument can be hashed into a shorter one)",
                    )
                    return None
                label = spec.owner_template(task.name)
                was_held = self.leases.held(key) is not None
                lock = self.owner_lease(key, spec, label)
                if not isinstance(lock, Lock):
                    self.missed.skipped(key, entry, spec, label, lock)
                    skipped(
                        entry.task,
                        key,
                        ELSEWHERE,
                        holder=lock,
                        level=logging.DEBUG,
                        label=label,
                        store=self.locks.store,
                    )
                    self.refused.pop(name, None)
                    return None
                if not was_held and self.took(key, lock, entry, spec):
                    logger.info(
                        "Not publishing %s: the beat that held %r before this one recorded "
                        "this tick (within half a period) and published it",
                        entry.task,
                        key,
                    )
                    return None
                headers = {HEADER_KEY: key, HEADER_TOKEN: lock.fencing_token}
                if spec.once.catch_up and self.locks.store.supports_ticks:
                    tick_ms = int(self.missed.wall() * 1000)
                    scheduled = tick_ms / 1000  # the header says what the record says
                    if not self.record_tick(lock, tick_ms):
                        logger.warning(
                            "Not publishing %s: its owner lease %r is no longer this beat's "
                            "(the tick could not be recorded); the beat holding it publishes",
                            entry.task,
                            key,
                        )
                        return None
        except LocksError as exc:
            # Never fail open: without an answer from the store this beat does not publish.
            logger.error("Not publishing %s: the lock store failed (%s)", entry.task, exc)
            return None
        except Exception as exc:
            self.refuse(
                name,
                entry,
                exc,
                "django_locks could not tell whether this beat may publish it",
                "make sure beat can import the task's module and that the entry's task and "
                "arguments fit the task (the traceback says where it failed)",
                traceback=True,
            )
            return None
        if self.refused.pop(name, None) is not None:
            logger.info("Beat entry %r (task %r) is published again", name, entry.task)
        return self._publish(entry, producer, headers, scheduled)

    def publish(
        self, entry: Any, producer: Any, key: str, lock: Lock, scheduled: float, *, catch_up: bool
    ) -> Any:
        """Publish ``entry`` under the owner lease ``lock`` on ``key``, as the tick due at
        ``scheduled`` (wall-clock seconds); ``catch_up``: a missed tick published late."""
        headers: dict[str, Any] = {HEADER_KEY: key, HEADER_TOKEN: lock.fencing_token}
        if catch_up:
            headers[HEADER_CATCH_UP] = "1"
        return self._publish(entry, producer, headers, scheduled)

    def _publish(
        self, entry: Any, producer: Any, headers: dict[str, Any], scheduled: float | None
    ) -> Any:
        moment = time.time() if scheduled is None else scheduled
        headers[HEADER_SCHEDULED] = datetime.datetime.fromtimestamp(
            moment, datetime.UTC
        ).isoformat()
        headers[HEADER_BEAT] = self.holder
        reset = _publishing.set(headers)
        try:
            return self._apply_entry(entry, producer=producer)
        finally:
            _publishing.reset(reset)
            if HEADER_KEY in headers:
                self.published[headers[HEADER_KEY]] = self.locks.clock.monotonic()

    def took(self, key: str, lock: Lock, entry: Any, spec: JobSpec) -> bool:
        """``MissedTicks.took`` at a due tick (True: the predecessor published it); whatever
        fails there, the tick is decided as without it."""
        try:
            return self.missed.took(key, lock, entry, spec, time.time())
        except Exception:
            logger.exception("django_locks' missed-ticks report for %r failed; beat goes on", key)
            return False

    def record_tick(self, lock: Lock, tick_ms: int) -> bool:
        """Record the tick about to be published under ``lock`` (True once the store confirmed
        it, False when the lease is no longer this beat's)."""
        return bool(self.locks._record_tick(lock, tick_ms))

    def tick(self, *args: Any, **kwargs: Any) -> Any:
        """The scheduler's ``tick()``, then the missed-ticks check; beat sleeps no longer than
        until the next check."""
        assert self._tick is not None
        interval = self._tick(*args, **kwargs)
        try:
            self.missed.check()
        except Exception:
            logger.exception("django_locks' missed-ticks check failed; beat goes on")
        due = self.missed.due()
        if due is not None and isinstance(interval, int | float):
            interval = min(interval, max(due, 0.01))
        return interval

    def refuse(
        self,
        name: str,
        entry: Any,
        exc: BaseException,
        problem: str,
        fix: str,
        *,
        traceback: bool = False,
    ) -> None:
        """Log that the entry ``name`` is not published this tick.

        ERROR the first time an entry is refused with a given error, and again every
        :data:`REFUSAL_REPEAT` seconds while it lasts (beat ticks every few seconds: one line per
        tick would bury everything else); DEBUG in between.
        """
        error = f"{type(exc).__name__}: {exc}"
        now = self.now()
        last = self.refused.get(name)
        if last is not None and last[0] == error and now - last[1] < REFUSAL_REPEAT:
            logger.debug("Beat entry %r is still refused (%s)", name, error)
            return
        self.refused[name] = (error, now)
        logger.error(
            "Beat entry %r (task %r) refused, not published: %s: %s. Fix: %s. Beat and every "
            "other entry go on; this entry is refused at each tick until it is fixed (logged "
            "again every %d s while the error lasts).",
            name,
            getattr(entry, "task", None),
            problem,
            error,
            fix,
            REFUSAL_REPEAT,
            exc_info=exc if traceback else None,
        )

    def leader_token(self) -> int | None:
        term = self.term
        return term.fencing_token if term is not None else None

    def entry_key(self, task: Any, spec: JobSpec, entry: Any) -> str:
        """The owner lease key of this entry (a template is formatted from its arguments)."""
        args = tuple(entry.args or ())
        if getattr(task.run, "__self__", None) is task:
            args = (task, *args)
        return spec.owner_key(args, dict(entry.kwargs or {}), task.name)

    def close(self) -> Any:
        """Hand every lease back (each after the grace of a tick it just published), then close
        the scheduler."""
        term, self.term = self.term, None
        try:
            self.leases.hand_back(self.grace, also=[term.lock] if term is not None else [])
            if term is not None:
                term.end("released")  # as for elections: a term that ends is announced
        finally:
            # Whatever handing back did, the scheduler is closed (its schedule is synced).
            result = self._close()
        return result

    def grace(self, lock: Lock) -> float:
        """Seconds ``lock`` stays after this beat hands it back: what remains of
        :data:`HANDBACK_GRACE` since it last published under it (the tick it just published
        cannot be published again by a beat waking a moment later)."""
        since = float(self.locks.clock.monotonic()) - self.published.get(lock.key, float("-inf"))
        return HANDBACK_GRACE - since


def _handed_back(lock: Lock, grace: float) -> None:
    if grace:
        logger.info(
            "This beat handed back %r (free in %.2fs, after the tick it just published)",
            lock.key,
            grace,
        )
    else:
        logger.info("This beat handed back %r", lock.key)


def add_headers(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """``before_task_publish``: add beat's headers to the message being published."""
    ours = _publishing.get()
    if ours is not None and headers is not None:
        headers.update(ours)
