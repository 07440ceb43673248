"""``RenewalBatch``: the locks one process holds on one store, renewed in one call per round."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from django_locks import events
from django_locks.clock import Clock
from django_locks.policy import POLICY
from django_locks.stores.base import LockStore

if TYPE_CHECKING:
    from django_locks.renewal import Keeper


def tell_renewed(
    store: LockStore, duration: float, count: int, renewed: bool, error: Exception | None
) -> None:
    """Tell the event stream of one renewal round trip of ``count`` locks (on the renewal
    thread: its consumers must be quick)."""
    outcome = "error" if error is not None else "renewed" if renewed else "refused"
    event = events.Event(
        "renewed",
        "",
        "",
        events.store_name(store),
        outcome=outcome,
        duration=duration,
        count=count,
    )
    events.emit(event)


held: set[Keeper] = set()
"""Every lock this process holds: a keeper joins when acquired and leaves when it stops being
held (its timer references it that long anyway). Renewal batches pick theirs from it."""


class RenewalBatch:
    """Renews the locks one process holds on one store together, in ONE store call
    (``renew_many``) per round, instead of one call per lock.

    A round starts when some lock's renewal falls due; it takes along every lock whose renewal
    falls due soon (``Keeper.join_round`` says which, by the renewal policy). While a round's call
    is out, locks falling due wait for the next round, which starts as soon as the call returns.
    """

    def __init__(self, store: LockStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self._mutex = threading.Lock()
        self._running = False
        self._again = False

    def due(self) -> None:
        with self._mutex:
            if self._running:
                self._again = True
                return
            self._running = True
        self.clock.spawn(self._run)

    def _run(self) -> None:
        try:
            while True:
                now = self.clock.monotonic()
                with self._mutex:
                    self._again = False
                    batch = [
                        keeper
                        for keeper in list(held)  # one step: other threads add and discard
                        if keeper.join_round(self, now)
                    ]
                if batch:
                    self._renew(batch, now)
                with self._mutex:
                    if not self._again:
                        self._running = False
                        return
        except BaseException:
            with self._mutex:
                self._running = False
            raise

    def _renew(self, batch: list[Keeper], sent: float) -> None:
        # The earliest deadline of the round bounds the call.
        timeout = POLICY.renew_timeout(min(keeper.deadline for keeper in batch), sent)
        leases = [(keeper.lease_key, keeper.owner, keeper.ttl_ms) for keeper in batch]
        try:
            results = self.store.renew_many(leases, timeout=timeout)
        except Exception as exc:  # retried by each lock until its deadline, never a refusal
            for keeper in batch:
                keeper.answered(sent, False, exc)
            tell_renewed(self.store, self.clock.monotonic() - sent, len(batch), False, exc)
            return
        took = self.clock.monotonic() - sent
        for keeper, renewed in zip(batch, results, strict=True):
            keeper.answered(sent, renewed, None)
        tell_renewed(self.store, took, len(batch), all(r is True for r in results), None)


_batches: weakref.WeakKeyDictionary[LockStore, dict[int, RenewalBatch]] = (
    weakref.WeakKeyDictionary()
)
_batches_mutex = threading.Lock()


# The batch asked for last, nearly always the next one asked for (it keeps its store alive).
_last_batch: RenewalBatch | None = None


def batch_for(store: LockStore, clock: Clock) -> RenewalBatch | None:
    """The batch of ``store`` and ``clock`` in this process, or None when the store renews one
    lock per call only."""
    global _last_batch
    batch = _last_batch
    if batch is not None and batch.store is store and batch.clock is clock:
        return batch
    if type(store).renew_many is LockStore.renew_many:
        return None
    with _batches_mutex:
        per_clock = _batches.setdefault(store, {})
        batch = per_clock.get(id(clock))
        if batch is None or batch.clock is not clock:
            batch = per_clock[id(clock)] = RenewalBatch(store, clock)
        _last_batch = batch
        return batch


def forget_batches_in_child() -> None:
    """After fork(), in the child (``django_locks.process.AFTER_FORK``)."""
    # The parent's batches (their mutexes, their running flags) mean nothing in a forked child.
    global _batches, _batches_mutex, _last_batch
    _batches = weakref.WeakKeyDictionary()
    _batches_mutex = threading.Lock()
    _last_batch = None
