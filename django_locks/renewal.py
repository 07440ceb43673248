"""Keeping a held lock: renewal, the holder deadline, announcing a loss, fork safety.

Every figure (the renewal period, DRIFT, MARGIN, timeouts, retries) is the lock's
``RenewalPolicy`` (``django_locks.policy``). The holder deadline (SPEC section 5) is counted from
the moment the last renewal the store confirmed was *sent*: ``sent + ttl * (1 - DRIFT) - MARGIN``.
The store extended the lease no earlier than that moment, on its own clock, so our deadline ends
before the store's expiry as long as the two clocks' rates differ by less than ``DRIFT``. The
deadline is a timer of the clock, never the thread waiting for a store call: a hanging call cannot
keep a lost lock "held".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from django_locks import events
from django_locks.abort import AbortController, AbortSignal
from django_locks.clock import Clock, TimerHandle
from django_locks.events import Use
from django_locks.exceptions import AbortedError, DetectedBy, LockLostError, LockReleasedError
from django_locks.policy import DRIFT as DRIFT  # where the API reference has long shown them
from django_locks.policy import MARGIN as MARGIN
from django_locks.policy import MIN_CALL_TIMEOUT as MIN_CALL_TIMEOUT
from django_locks.policy import POLICY
from django_locks.renewal_batch import RenewalBatch, batch_for, tell_renewed
from django_locks.renewal_batch import held as _held
from django_locks.stores.base import LeaveReason, LockStore, ReleaseReason, slot_of

logger = logging.getLogger("django_locks")

State = Literal["held", "released", "lost", "abandoned", "detached"]


class Keeper:
    """The renewal state of one held lock. Referenced by its timers, never by them to the Lock,
    so a forgotten ``Lock`` can be garbage-collected (and lapse) while timers are pending.

    Made for every lock, between its acquire and release round trips: its ``signal`` is made
    when first asked for (most locks are released without anybody looking)."""

    __slots__ = (
        "_abort",
        "_batch",
        "_due",
        "_in_flight",
        "_mutex",
        "_reason",
        "_renew_at",
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
        "sender",
        "state",
        "store",
        "told",
        "ttl",
        "ttl_ms",
        "use",
    )

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
        label: str = "",
        use: Use = "acquire",
        permit: int | None = None,
    ) -> None:
        self.store = store
        self.label = label  # the event stream's (django_locks.events)
        self.use: Use = use
        # Whether the stream was told it was acquired: a lock its cancelled acquirer never saw
        # is released untold, so that every release or loss told follows its acquire.
        self.told = False
        self.acquired_at = clock.monotonic()
        self.clock = clock
        self.sender = sender
        self.key = key
        # A permit's lease is its slot (`<key>#<n>`): the key every store call names.
        self.permit = permit
        self.lease_key: str = key if permit is None else slot_of(key, permit)
        self.owner = owner
        self.fencing_token = fencing_token
        self.ttl = ttl_ms / 1000
        self.ttl_ms = ttl_ms
        self.state: State = "held"
        self._abort: AbortController | None = None  # made with the signal
        self._reason: BaseException | None = None  # why it ended (None: released)
        self._mutex = threading.RLock()
        self._timer: TimerHandle | None = None  # at the next renewal, then at the deadline
        self._in_flight = False  # a renewal of it is being sent
        self._batch = batch_for(store, clock)
        # What _confirmed(sent) does, inlined (one lock made per acquire): every field a
        # renewal batch reads is set before the keeper joins `_held`, where a batch running
        # on another thread may see it at once; its only timer is made last.
        self.deadline = POLICY.deadline(sent, self.ttl)
        self._due = False
        self._renew_at = renew_at = sent + POLICY.period(self.ttl)
        # Joined and timed under the mutex: a batch that takes it along at once answers under
        # the same mutex, so its timer (a renewal confirmed) is never overwritten by this one.
        with self._mutex:
            _held.add(self)
            self._timer = clock.call_at(min(renew_at, self.deadline), self._on_timer)

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

    @property
    def held(self) -> bool:
        return self.state == "held" and self.clock.monotonic() < self.deadline

    def _confirmed(self, sent: float) -> None:
        """The store confirmed the acquire or renewal sent at ``sent``: move the deadline."""
        self.deadline = POLICY.deadline(sent, self.ttl)
        self._due = False
        self._schedule_renewal(sent + POLICY.period(self.ttl))

    def _schedule_renewal(self, when: float) -> None:
        """One timer per lock: at its next renewal, and once that fell due, at its deadline."""
        self._renew_at = when
        self._cancel_timer()
        self._timer = self.clock.call_at(min(when, self.deadline), self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        with self._mutex:
            now = self.clock.monotonic()
            timer = self._timer
            if self.state != "held" or (timer is not None and timer.when > now):
                return  # released, or a timer replaced just as it fell due
            if now >= self.deadline:
                # A deadline already passed wins: a process waking from a pause reports the loss
                # before it sends anything.
                announce = self._lose("deadline")
            else:
                # The deadline stands while the renewal is out (or waits for its batch).
                self._timer = self.clock.call_at(self.deadline, self._on_timer)
                if self._in_flight or now < self._renew_at:
                    return
                self._due = True
                announce = None
        if announce is not None:
            announce()
        elif self._batch is not None:
            self._batch.due()
        else:
            self._in_flight = True
            self._due = False
            self.clock.spawn(lambda: self._renew(now))

    def join_round(self, batch: RenewalBatch, now: float) -> bool:
        """Whether ``batch``, renewing at ``now``, takes this lock along; if so the renewal is
        in flight from now on (the batch calls it under its own mutex and answers it with
        :meth:`answered`). Taken along: a lock of that batch whose renewal fell due, or falls
        due within the policy's look-ahead (renewing early costs nothing and brings the locks
        of a process into step, so the next batch renews them all at once)."""
        if (
            self._batch is batch
            and self.state == "held"
            and not self._in_flight
            and (self._due or self._renew_at - now <= POLICY.lookahead(self.ttl))
            and now < self.deadline
        ):
            self._in_flight = True
            self._due = False
            return True
        return False

    def _renew(self, sent: float) -> None:
        error: Exception | None = None
        renewed = False
        try:
            renewed = self.store.renew(
                self.lease_key,
                self.owner,
                self.ttl_ms,
                timeout=POLICY.renew_timeout(self.deadline, sent),
            )
        except Exception as exc:  # any failure is retried until the deadline, never a refusal
            error = exc
        self.answered(sent, renewed, error)
        tell_renewed(self.store, self.clock.monotonic() - sent, 1, renewed, error)

    def answered(self, sent: float, renewed: bool, error: Exception | None) -> None:
        """The store answered the renewal sent at ``sent`` (or failed with ``error``): this
        lock's own renewal, or its batch's."""
        announce: Callable[[], None] | None = None
        retry: tuple[float, float] | None = None  # logged after the mutex: a slow log handler
        with self._mutex:  # must not hold up the timer thread, which takes it too
            self._in_flight = False
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
                retry_in = POLICY.retry(self.ttl)
                retry = (retry_in, self.deadline - now)
                self._schedule_renewal(now + retry_in)
            elif not renewed:
                announce = self._lose("renewal")
            else:
                self._confirmed(sent)
        if retry is not None:
            logger.warning(
                "Renewing lock %r failed (%s); retrying in %.2fs until its deadline in %.2fs",
                self.key,
                error,
                *retry,
            )
        if announce is not None:
            announce()

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

    def call_timeout(self) -> float:
        """Seconds a store call of this lock may take now: its remaining validity (the holder
        deadline), never less than the policy's ``min_call_timeout``."""
        return POLICY.call_timeout(self.deadline, self.clock.monotonic())

    def release(self, how: ReleaseReason = "released") -> bool:
        """Stop renewing and free the lease. ``True`` if the store confirmed it was still ours.
        The store call is bounded by :meth:`call_timeout`; ``StoreError`` when it fails.
        ``how`` is recorded as the way the lease ended, where the store keeps that."""
        return self.stop(how) and self.free(how)

    def free(self, how: ReleaseReason = "released") -> bool:
        """The store call of a release, once :meth:`stop` said the lock was held (no mutex
        taken: the async release runs it in a thread after stopping on the event loop)."""
        return self.store.end(self.lease_key, self.owner, how, timeout=self.call_timeout())

    def leave(self, ttl_ms: int, how: LeaveReason = "lapsed") -> bool:
        """Stop renewing and leave the lease to lapse ``ttl_ms`` from now (one renewal), to end
        then as ``how``. ``True`` if the store confirmed it was still ours."""
        if not self.stop(how):
            return False
        # A renewal already sent would, answered after this one, move the expiry back to the
        # lock's ttl (a command's min_hold cut short, a beat's hand-back stretched): let it be
        # answered first. It ends by the holder deadline, whatever the store does.
        while self._in_flight and self.clock.monotonic() < self.deadline:
            time.sleep(POLICY.leave_poll)
        return self.store.leave(
            self.lease_key, self.owner, ttl_ms, how, timeout=self.call_timeout()
        )

    def stop(self, how: ReleaseReason | LeaveReason = "released") -> bool:
        """Stop renewing before a release or a leave (``how``: the end the event stream is
        told); whether the lock was still held. Past the holder deadline it is lost, even
        before its timer fired (a process just woken from a pause races its timer thread):
        whichever thread gets there first announces the loss. No I/O: the event loop calls it
        directly."""
        with self._mutex:
            if self.state != "held":
                return False
            lost = self.clock.monotonic() >= self.deadline
            if lost:
                announce = self._lose("deadline")
            else:
                callbacks = self._end("released", None)
        if lost:
            announce()
            return False
        self._tell("released", how)
        if callbacks:
            self.clock.notify(lambda: self._run_callbacks(callbacks))
        return True

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


def held_keepers() -> list[Keeper]:
    """Every lock this process is keeping, for the testing reset helper."""
    return [keeper for keeper in list(_held) if keeper.state == "held"]


def detach_inherited_locks() -> None:
    """After fork(), in the child (``django_locks.process.AFTER_FORK``)."""
    # A forked child shares the parent's owner ids: renewing or releasing them here would act on
    # the parent's leases. The child simply does not hold them (renewal_batch forgets the
    # parent's batches on its own).
    for keeper in list(_held):
        keeper.detach("it was inherited across fork() and stays the parent's", after_fork=True)
