"""How a held lock stops being held other than by its holder's release: lost (a renewal
refused, its deadline passed), capped at its ``max_hold``, preempted by a replacing run,
abandoned (garbage-collected), detached (not this process's). The base of ``Keeper``
(``django_locks.renewal``), which renews; the announcements run off the renewal thread's path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django_locks import events
from django_locks.abort import AbortController, AbortSignal
from django_locks.clock import Clock, TimerHandle
from django_locks.events import Use
from django_locks.exceptions import (
    AbortedError,
    DetectedBy,
    LockLostError,
    LockReleasedError,
    PreemptedError,
)
from django_locks.policy import POLICY
from django_locks.renewal_batch import held as _held
from django_locks.stores.base import LockStore

if TYPE_CHECKING:
    from django_locks.renewal import State

logger = logging.getLogger("django_locks")


class KeeperEnds:
    """The ends of a :class:`~django_locks.renewal.Keeper` its holder did not choose."""

    __slots__ = (
        "_abort",
        "_in_flight",
        "_mutex",
        "_reason",
        "_timer",
        "acquired_at",
        "clock",
        "deadline",
        "fencing_token",
        "key",
        "label",
        "lease_key",
        "owner",
        "permit",
        "state",
        "store",
        "told",
        "ttl",
        "ttl_ms",
        "use",
    )

    # The fields (Keeper.__init__ sets them), which these methods read and set.
    store: LockStore
    clock: Clock
    key: str
    lease_key: str
    owner: str
    fencing_token: int
    ttl: float
    ttl_ms: int
    state: State
    label: str
    use: Use
    told: bool
    acquired_at: float
    permit: int | None
    deadline: float
    _abort: AbortController | None
    _reason: BaseException | None
    _mutex: threading.RLock
    _timer: TimerHandle | None
    _in_flight: bool

    @property
    def signal(self) -> AbortSignal:
        abort = self._abort
        if abort is None:
            with self._mutex:
                abort = self._abort
                if abort is None:
                    abort = AbortController()
                    if self.state != "held":
                        abort.settle(self._reason or self._released())
                    self._abort = abort
        return abort.signal

    def _released(self) -> LockReleasedError:
        return LockReleasedError(self.key, self.fencing_token)

    def _end(self, state: State, reason: BaseException | None) -> list[Any]:
        """Stop being held (call with the mutex held): no more timers, and the signal (if it
        was made) aborts with ``reason`` (``None``: released). Returns its callbacks to run."""
        self.state = state
        _held.discard(self)
        self._cancel_timer()
        if self._abort is None:
            self._reason = reason
            return []
        return self._abort.settle(reason or self._released())

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def call_timeout(self) -> float:
        """Seconds a store call of this lock may take now: its remaining validity (the holder
        deadline), never less than the policy's ``min_call_timeout``."""
        return POLICY.call_timeout(self.deadline, self.clock.monotonic())

    def _lose(self, detected_by: DetectedBy) -> Callable[[], None]:
        """Mark the lock lost (call with the mutex held); return the announcement to run after."""
        error = LockLostError(self.key, self.fencing_token, detected_by)
        callbacks = self._end("lost", error)  # the signal aborts now, callbacks run off this path
        if detected_by == "deadline":
            # The store may still hold our lease (a renewal was in flight, or it is unreachable);
            # free it for the next holder as soon as the store answers.
            self.clock.spawn(self._release_quietly)

        def announce() -> None:
            self.clock.notify(lambda: self._announce_loss(error, callbacks))

        return announce

    def _cap(self) -> Callable[[], None]:
        """The lock reached its max_hold (call with the mutex held): renewals stop, ONE last
        renewal records the end as "max hold" and leaves the lease its ttl (time for the work
        to stop), then the loss is announced (``lock_lost``, ``detected_by="max_hold"``)."""
        error = LockLostError(self.key, self.fencing_token, "max_hold")
        callbacks = self._end("capped", error)

        def leave_and_announce() -> None:
            # A renewal in flight, answered after this one, would move the expiry again: it
            # ends by the holder deadline whatever the store does.
            while self._in_flight and self.clock.monotonic() < self.deadline:
                time.sleep(POLICY.leave_poll)
            try:
                self.store.leave(
                    self.lease_key, self.owner, self.ttl_ms, "max hold", timeout=self.call_timeout()
                )
            except Exception as exc:  # the lease then shows "expired" at its ttl
                logger.warning("Recording the max hold of %r failed: %s", self.key, exc)
            self.clock.notify(lambda: self._announce_loss(error, callbacks))

        return lambda: self.clock.spawn(leave_and_announce)

    def _preempted(self) -> Callable[[], None]:
        """A renewal found a replacing run's request for this lease (call with the mutex held):
        renewals stop and the signal aborts with ``PreemptedError``; no ``lock_lost`` (nothing
        failed). The block's exit still releases it (:meth:`stop`), else it lapses at its ttl."""
        error = PreemptedError(self.key, self.fencing_token)
        callbacks = self._end("preempted", error)
        return lambda: self.clock.notify(lambda: self._announce_loss(error, callbacks))

    def _announce_loss(self, error: LockLostError, callbacks: list[Any]) -> None:
        # The stream's first consumer logs the loss and sends lock_lost (django_locks.signals).
        self._tell("lost", error.detected_by)
        self._run_callbacks(callbacks)

    def _tell(self, kind: events.EventKind, outcome: str) -> None:
        """Tell the event stream this lock was released or lost (``outcome``: how). A release
        is told once its acquire was; a loss always is (its signal and log line are the
        stream's: a lost lock is always announced)."""
        if not self.told and kind == "released":
            return
        event = events.Event(
            kind,
            self.key,
            self.label,
            events.store_name(self.store),
            self.use,
            outcome,
            self.clock.monotonic() - self.acquired_at,
            self.fencing_token,
            permit=self.permit,
        )
        events.emit(event)

    def _run_callbacks(self, callbacks: list[Any]) -> None:
        for callback in callbacks:
            try:
                callback(self.signal)
            except Exception:
                logger.exception("An AbortSignal callback %r failed", callback)

    def _release_quietly(self) -> None:
        try:
            self.store.release(self.lease_key, self.owner, timeout=self.call_timeout())
        except Exception as exc:
            logger.debug("Releasing lost lock %r failed: %s (it lapses at its ttl)", self.key, exc)

    def abandon(self) -> None:
        """The ``Lock`` was garbage-collected while held: stop renewing, let it lapse at ttl."""
        with self._mutex:
            if self.state != "held":
                return
            callbacks = self._end(
                "abandoned",
                AbortedError(f"lock {self.key!r} was garbage-collected without release()"),
            )
        self._tell("released", "abandoned")
        self.store.forsake(self.lease_key, self.owner)
        logger.warning(
            "Lock %r (fencing token %s) was garbage-collected without release(); it is no longer "
            "renewed and lapses within its ttl of %gs. Use `with locks.lock(...)` or call "
            "release().",
            self.key,
            self.fencing_token,
            self.ttl,
        )
        if callbacks:
            self.clock.notify(lambda: self._run_callbacks(callbacks))

    def detach(self, reason: str, *, after_fork: bool = False) -> None:
        """Forget the lock without any I/O (it belongs to another process, or to nobody now).

        Its signal aborts, so work waiting on it here stops; its callbacks are not run (they
        belong to whoever registered them, which may be the parent process)."""
        if after_fork:
            # Another thread of the parent may have held these at fork() time.
            self._mutex = threading.RLock()
            if self._abort is not None:
                self._abort.reset_after_fork()
        self._timer = None  # the clock's, not ours to cancel (a child has no timer thread yet)
        error = AbortedError(f"lock {self.key!r} is not held here: {reason}")
        self.state = "detached"
        _held.discard(self)
        self._reason = error
        if self._abort is not None:
            self._abort.settle(error)
