"""Keeping a held lock: renewal every ttl/3, the holder deadline, announcing a loss, fork safety.

The holder deadline (SPEC section 5) is counted from the moment the last renewal the store
confirmed was *sent*: ``sent + ttl * (1 - DRIFT) - MARGIN``. The store extended the lease no earlier
than that moment, on its own clock, so our deadline ends before the store's expiry as long as the
two clocks' rates differ by less than ``DRIFT``. The deadline is a timer of the clock, never the
thread waiting for a store call: a hanging call cannot keep a lost lock "held".
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Literal

from django_locks import signals
from django_locks.abort import AbortSignal
from django_locks.clock import Clock, TimerHandle
from django_locks.exceptions import AbortedError, DetectedBy, LockLostError, LockReleasedError
from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")

DRIFT = 0.01
"""The largest rate difference assumed between the holder's clock and the store's (1%)."""

MARGIN = 0.005
"""Seconds taken off every deadline for scheduling latency (5 ms)."""

State = Literal["held", "released", "lost", "abandoned", "detached"]

_keepers: weakref.WeakSet[Keeper] = weakref.WeakSet()


class Keeper:
    """The renewal state of one held lock. Referenced by its timers, never by them to the Lock,
    so a forgotten ``Lock`` can be garbage-collected (and lapse) while timers are pending."""

    def __init__(
        self,
        *,
        store: LockStore,
        clock: Clock,
        sender: Any,
        key: str,
        owner: str,
        fencing_token: int,
        ttl_ms: int,
        sent: float,
    ) -> None:
        self.store = store
        self.clock = clock
        self.sender = sender
        self.key = key
        self.owner = owner
        self.fencing_token = fencing_token
        self.ttl = ttl_ms / 1000
        self.ttl_ms = ttl_ms
        self.signal = AbortSignal()
        self.state: State = "held"
        self.deadline = 0.0
        self._mutex = threading.RLock()
        self._renew_timer: TimerHandle | None = None
        self._deadline_timer: TimerHandle | None = None
        _keepers.add(self)
        with self._mutex:
            self._confirmed(sent)

    @property
    def held(self) -> bool:
        return self.state == "held" and self.clock.monotonic() < self.deadline

    def _confirmed(self, sent: float) -> None:
        """The store confirmed the acquire or renewal sent at ``sent``: move the deadline."""
        self.deadline = sent + self.ttl * (1 - DRIFT) - MARGIN
        self._cancel_timers()
        self._deadline_timer = self.clock.call_at(self.deadline, self._on_deadline)
        self._renew_timer = self.clock.call_at(sent + self.ttl / 3, self._on_renew_due)

    def _cancel_timers(self) -> None:
        for timer in (self._renew_timer, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._renew_timer = self._deadline_timer = None

    def _on_deadline(self) -> None:
        with self._mutex:
            if self.state != "held" or self.clock.monotonic() < self.deadline:
                return
            announce = self._lose("deadline")
        announce()

    def _on_renew_due(self) -> None:
        with self._mutex:
            if self.state != "held":
                return
            now = self.clock.monotonic()
            if now >= self.deadline:
                # A deadline already passed wins: a process waking from a pause reports the loss
                # before it sends anything.
                announce = self._lose("deadline")
            else:
                self._renew_timer = None
                announce = None
        if announce is not None:
            announce()
        else:
            self.clock.spawn(lambda: self._renew(now))

    def _renew(self, sent: float) -> None:
        error: Exception | None = None
        renewed = False
        try:
            renewed = self.store.renew(
                self.key, self.owner, self.ttl_ms, timeout=max(self.deadline - sent, 0.001)
            )
        except Exception as exc:  # any failure is retried until the deadline, never a refusal
            error = exc
        announce: Callable[[], None] | None = None
        with self._mutex:
            if self.state != "held":
                if renewed and self.state == "lost":
                    self.clock.spawn(self._release_quietly)
                return
            now = self.clock.monotonic()
            if now >= self.deadline:
                # The answer came after the deadline: it does not count.
                announce = self._lose("deadline")
                if renewed:
                    self.clock.spawn(self._release_quietly)
            elif error is not None:
                retry_in = min(self.ttl / 10, 1.0)
                logger.warning(
                    "Renewing lock %r failed (%s); retrying in %.2fs until its deadline in %.2fs",
                    self.key,
                    error,
                    retry_in,
                    self.deadline - now,
                )
                self._renew_timer = self.clock.call_at(now + retry_in, self._on_renew_due)
            elif not renewed:
                announce = self._lose("renewal")
            else:
                self._confirmed(sent)
        if announce is not None:
            announce()

    def _lose(self, detected_by: DetectedBy) -> Callable[[], None]:
        """Mark the lock lost (call with the mutex held); return the announcement to run after."""
        self.state = "lost"
        self._cancel_timers()
        error = LockLostError(self.key, self.fencing_token, detected_by)
        callbacks = self.signal._set(error)  # the signal aborts now, callbacks run off this path
        if detected_by == "deadline":
            # The store may still hold our lease (a renewal was in flight, or it is unreachable);
            # free it for the next holder as soon as the store answers.
            self.clock.spawn(self._release_quietly)

        def announce() -> None:
            self.clock.notify(lambda: self._announce_loss(error, callbacks))

        return announce

    def _announce_loss(self, error: LockLostError, callbacks: list[Any]) -> None:
        logger.warning(
            "Lock lost: key=%r fencing_token=%s detected_by=%s owner=%s",
            error.key,
            error.fencing_token,
            error.detected_by,
            self.owner,
        )
        signals.send(
            signals.lock_lost,
            self.sender,
            key=error.key,
            fencing_token=error.fencing_token,
            detected_by=error.detected_by,
        )
        self._run_callbacks(callbacks)

    def _run_callbacks(self, callbacks: list[Any]) -> None:
        for callback in callbacks:
            try:
                callback(self.signal)
            except Exception:
                logger.exception("An AbortSignal callback %r failed", callback)

    def _release_quietly(self) -> None:
        try:
            self.store.release(self.key, self.owner)
        except Exception as exc:
            logger.debug("Releasing lost lock %r failed: %s (it lapses at its ttl)", self.key, exc)

    def release(self) -> bool:
        """Stop renewing and free the lease. ``True`` if the store confirmed it was still ours."""
        with self._mutex:
            was_held = self.state == "held"
            if was_held:
                self.state = "released"
                self._cancel_timers()
                callbacks = self.signal._set(LockReleasedError(self.key, self.fencing_token))
        if not was_held:
            return False
        if callbacks:
            self.clock.notify(lambda: self._run_callbacks(callbacks))
        return self.store.release(self.key, self.owner)

    def leave(self, ttl_ms: int) -> bool:
        """Stop renewing and leave the lease to lapse ``ttl_ms`` from now (one renewal).
        ``True`` if the store confirmed it was still ours."""
        with self._mutex:
            if self.state != "held":
                return False
            self.state = "released"
            self._cancel_timers()
            callbacks = self.signal._set(LockReleasedError(self.key, self.fencing_token))
        if callbacks:
            self.clock.notify(lambda: self._run_callbacks(callbacks))
        return self.store.renew(self.key, self.owner, ttl_ms)

    def abandon(self) -> None:
        """The ``Lock`` was garbage-collected while held: stop renewing, let it lapse at ttl."""
        with self._mutex:
            if self.state != "held":
                return
            self.state = "abandoned"
            self._cancel_timers()
            callbacks = self.signal._set(
                AbortedError(f"lock {self.key!r} was garbage-collected without release()")
            )
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
            self.signal._mutex = threading.Lock()
        self.state = "detached"
        self._renew_timer = self._deadline_timer = None
        self.signal._set(AbortedError(f"lock {self.key!r} is not held here: {reason}"))


def held_keepers() -> list[Keeper]:
    """Every lock this process is keeping, for the testing reset helper."""
    return [keeper for keeper in list(_keepers) if keeper.state == "held"]


def _detach_inherited_locks() -> None:
    # A forked child shares the parent's owner ids: renewing or releasing them here would act on
    # the parent's leases. The child simply does not hold them.
    for keeper in list(_keepers):
        keeper.detach("it was inherited across fork() and stays the parent's", after_fork=True)


os.register_at_fork(after_in_child=_detach_inherited_locks)
