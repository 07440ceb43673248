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
from typing import Literal

from django_locks.abort import AbortController
from django_locks.clock import Clock, TimerHandle
from django_locks.events import Use
from django_locks.exceptions import DetectedBy
from django_locks.lease_ends import KeeperEnds
from django_locks.policy import DRIFT as DRIFT  # where the API reference has long shown them
from django_locks.policy import MARGIN as MARGIN
from django_locks.policy import MIN_CALL_TIMEOUT as MIN_CALL_TIMEOUT
from django_locks.policy import POLICY
from django_locks.renewal_batch import RenewalBatch, batch_for, tell_renewed
from django_locks.renewal_batch import held as _held
from django_locks.stores.base import (
    PREEMPTED,
    LeaveReason,
    LockStore,
    ReleaseReason,
    Renewed,
    slot_of,
)

logger = logging.getLogger("django_locks")

State = Literal["held", "released", "lost", "capped", "preempted", "abandoned", "detached"]
"""Where a lock is: ``capped`` reached its ``max_hold`` (left to lapse, recorded as "max hold"),
``preempted`` was asked for by a replacing run (its block's exit still releases it)."""


class Keeper(KeeperEnds):
    """The renewal state of one held lock. Referenced by its timers, never by them to the Lock,
    so a forgotten ``Lock`` can be garbage-collected (and lapse) while timers are pending.

    Made for every lock, between its acquire and release round trips: its ``signal`` is made
    when first asked for (most locks are released without anybody looking)."""

    __slots__ = ("_batch", "_due", "_hold_until", "_renew_at")

    def __init__(
        self,
        *,
        store: LockStore,
        clock: Clock,
        key: str,
        owner: str,
        fencing_token: int,
        ttl_ms: int,
        sent: float,
        label: str = "",
        use: Use = "acquire",
        permit: int | None = None,
        store_key: str | None = None,
        max_hold_ms: int | None = None,
    ) -> None:
        self.store = store
        self.label = label  # the event stream's (django_locks.events)
        self.use: Use = use
        # Whether the stream was told it was acquired: a lock its cancelled acquirer never saw
        # is released untold, so that every release or loss told follows its acquire.
        self.told = False
        self.acquired_at = clock.monotonic()
        self.clock = clock
        self.key = key
        # A permit's lease is its slot (`<key>#<n>`): the key every store call names, with the
        # service's KEY_PREFIX (`store_key`); `key` is the one people see.
        self.permit = permit
        base = key if store_key is None else store_key
        self.lease_key: str = base if permit is None else slot_of(base, permit)
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
        # When renewals stop for good (max_hold), on the clock that times them.
        self._hold_until = (
            float("inf") if max_hold_ms is None else self.acquired_at + max_hold_ms / 1000
        )
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
            self._timer = clock.call_at(self._next_timer(renew_at), self._on_timer)

    @property
    def held(self) -> bool:
        return self.state == "held" and self.clock.monotonic() < self.deadline

    def _confirmed(self, sent: float) -> None:
        """The store confirmed the acquire or renewal sent at ``sent``: move the deadline."""
        self.deadline = POLICY.deadline(sent, self.ttl)
        self._due = False
        self._schedule_renewal(sent + POLICY.period(self.ttl))

    def _schedule_renewal(self, when: float) -> None:
        """One timer per lock: at its next renewal, and once that fell due, at its deadline
        (or at its max_hold, when that comes first)."""
        self._renew_at = when
        self._cancel_timer()
        self._timer = self.clock.call_at(self._next_timer(when), self._on_timer)

    def _next_timer(self, renew_at: float) -> float:
        return min(renew_at, self.deadline, self._hold_until)

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
            elif now >= self._hold_until:
                announce = self._cap()
            else:
                # The deadline stands while the renewal is out (or waits for its batch).
                self._timer = self.clock.call_at(
                    min(self.deadline, self._hold_until), self._on_timer
                )
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
            and now < self._hold_until
        ):
            self._in_flight = True
            self._due = False
            return True
        return False

    def _renew(self, sent: float) -> None:
        error: Exception | None = None
        renewed: Renewed = False
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
        tell_renewed(self.store, self.clock.monotonic() - sent, 1, renewed is True, error)

    def answered(self, sent: float, renewed: Renewed, error: Exception | None) -> None:
        """The store answered the renewal sent at ``sent`` (or failed with ``error``): this
        lock's own renewal, or its batch's."""
        announce: Callable[[], None] | None = None
        retry: tuple[float, float] | None = None  # logged after the mutex: a slow log handler
        with self._mutex:  # must not hold up the timer thread, which takes it too
            self._in_flight = False
            if self.state != "held":
                if renewed is True and self.state == "lost":
                    self.clock.spawn(self._release_quietly)
                return
            now = self.clock.monotonic()
            if now >= self.deadline:
                # The answer came after the deadline: it does not count.
                announce = self._lose("deadline")
                if renewed is True:
                    self.clock.spawn(self._release_quietly)
            elif renewed == PREEMPTED:
                announce = self._preempted()
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

    def check_failed(self, detected_by: DetectedBy = "renewal") -> BaseException:
        """A check of the lease outside the renewer found it gone (``lock.atomic()``'s): lost,
        and announced, unless it ended already. Returns why it ended (its signal's reason)."""
        with self._mutex:
            announce = self._lose(detected_by) if self.state == "held" else None
        if announce is not None:
            announce()
        return self.signal.reason or self._released()

    def check_passed(self, sent: float) -> None:
        """A check sent at ``sent`` that also extended the lease by its ttl was committed
        (``lock.atomic()`` on SQLite): it counts as a confirmed renewal."""
        with self._mutex:
            if self.state == "held" and self.clock.monotonic() < self.deadline:
                self._confirmed(sent)

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
            if self.state == "preempted":
                # Asked for by a replacing run, and now left: free it for that run at once (its
                # end was told when it was preempted).
                self.state = "released"
                return True
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
