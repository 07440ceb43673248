"""Who owns what in this process: owner leases, leadership terms, and the runs skipped for them."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

from django_locks import events
from django_locks.exceptions import LocksError
from django_locks.holders import Holder
from django_locks.lock import Lock, hand_back

if TYPE_CHECKING:
    from django_locks.service import Locks
    from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")

LostReason = Literal["lost", "released", "max_hold"]
ELSEWHERE = "it runs on another instance"
"""The ``reason`` of ``run_skipped`` when another process owns the job."""
IN_PROGRESS = "a run is still in progress"
"""The ``reason`` of ``run_skipped`` when the run lock is held."""
AT_CAPACITY = "every permit is taken"
"""The ``reason`` of ``run_skipped`` when every permit of a ``limit_concurrency`` key is held."""
NOT_REPLACED = "the running one did not stop in time"
"""The ``reason`` of ``run_skipped`` when a run with ``on_conflict="replace"`` waited for the
preempted holder to let go of the key, and it did not."""
MISSED = "the beat that owned it stopped before publishing this tick"
"""The ``reason`` of ``run_skipped`` for a beat tick nobody published (``catch_up``)."""
DUPLICATE = "a later enqueue of it holds its key"
"""The ``reason`` of ``run_skipped`` for a queued run whose enqueue-time lease lapsed before it
started while another enqueue of the same key holds the key (``django_locks.unique``)."""
CODES = {
    ELSEWHERE: "elsewhere",
    IN_PROGRESS: "in_progress",
    AT_CAPACITY: "at_capacity",
    NOT_REPLACED: "not_replaced",
    MISSED: "missed",
    DUPLICATE: "duplicate",
}
"""The ``code`` of ``run_skipped`` (the metrics label) of each reason."""


# Owner leases.


def skipped(
    name: str,
    key: str,
    reason: str,
    *,
    holder: Holder | None = None,
    level: int = logging.INFO,
    label: str | None = None,
    store: LockStore | None = None,
) -> None:
    """Tell the event stream of a skipped run: its log line names the holder where the store
    said who it is, and ``run_skipped`` is sent (sender: the ``Locks`` class). ``label``: the
    job's key template (default: the key's own label); ``store``: the default service's."""
    if store is None:
        store = _default_service().store
    event = events.Event(
        "run_skipped",
        key,
        label if label is not None else events.label_of(key),
        events.store_name(store),
        "run",
        CODES.get(reason, "elsewhere"),
        holder=holder,
        name=name,
        reason=reason,
        level=level,
    )
    events.emit(event)


def log_owner(name: str, lock: Lock) -> None:
    """Log that the job ``name`` runs here, under ``lock``: the one "runs on this instance"."""
    logger.info(
        "%s runs on this instance (lease %r, fencing token %s)",
        name,
        lock.key,
        lock.fencing_token,
    )


class OwnerLeases:
    """Owner leases held by this process, by key: taken with one store call, then held without
    any while their renewals last, and handed back together.

    ``service`` is the ``Locks`` that takes them (called at each take: the default service is
    rebuilt when the setting changes). ``handed_back(lock, grace)`` is told of each lease the
    store confirmed handed back (``grace``: the seconds it stays, 0 for at once).
    """

    def __init__(
        self,
        service: Callable[[], Locks] | None = None,
        *,
        handed_back: Callable[[Lock, float], None] | None = None,
    ) -> None:
        self.service = service if service is not None else _default_service
        self.handed_back = handed_back
        self.by_key: dict[str, Lock] = {}
        self.mutex = threading.Lock()

    def held(self, key: str) -> Lock | None:
        """The lease on ``key`` while this process holds it: no store call. A lost lease is not
        held (the next take takes it again, or finds it taken)."""
        lock = self.by_key.get(key)
        return lock if lock is not None and lock.held else None

    def take(
        self,
        name: str,
        key: str,
        ttl_ms: int | None = None,
        label: str | None = None,
        max_hold_ms: int | None = None,
    ) -> Lock | Holder | None:
        """The lease on ``key`` for the job ``name``: held already, or taken with one acquire
        (kept, logged), else who holds it (``None`` when the store cannot say). ``ttl_ms``: the
        service's when None; ``label``: the job's key template. Raises ``StoreError`` when the
        store fails."""
        lock = self.held(key)
        if lock is not None:
            return lock
        locks = self.service()
        ttl_ms = locks.ttl_ms if ttl_ms is None else ttl_ms
        found = locks._acquire(
            key, ttl_ms, 0.0, None, label=label, use="owner", max_hold_ms=max_hold_ms
        )
        if isinstance(found, Lock):
            self.keep(name, found)
        return found

    def keep(self, name: str, lock: Lock) -> None:
        """Keep ``lock`` (taken by the caller) as the job ``name``'s lease; logged."""
        with self.mutex:
            self.by_key[lock.key] = lock
        log_owner(name, lock)

    def hand_back(
        self, grace: Callable[[Lock], float] | None = None, also: Iterable[Lock] = ()
    ) -> None:
        """Hand back every lease held (and those of ``also``), forgetting them.

        ``grace(lock)``: seconds the lease stays in the store, then lapses unrenewed (it keeps
        others out that long); 0 or less, or no ``grace``: released at once. One failure does
        not keep the others: a lease whose hand-back fails lapses at its ttl.
        """
        with self.mutex:
            leases = [*self.by_key.values(), *also]
            self.by_key.clear()
        for lock in leases:
            try:
                seconds = grace(lock) if grace is not None else 0.0
                # Under a millisecond (the shortest lease) is at once.
                seconds = seconds if seconds >= 0.001 else 0.0
                done = hand_back(lock, seconds)
                if done and self.handed_back is not None:
                    self.handed_back(lock, seconds)
            except (LocksError, RuntimeError) as exc:
                # A store failure, or at interpreter exit a thread that can no longer start.
                logger.warning("Handing back %r failed (%s); it lapses at its ttl", lock.key, exc)
            except Exception:
                logger.exception("Handing back %r failed; it lapses at its ttl", lock.key)

    def forget_in_child(self) -> None:
        """After fork(), in the child: the parent's leases are not held here (the renewal step
        detached them), and another thread may have held the mutex at fork() time."""
        self.mutex = threading.Lock()
        self.by_key = {}


def _default_service() -> Locks:
    from django_locks.service import locks

    return locks


class _Sticky(OwnerLeases):
    """The sticky owner leases of plain functions: handed back when the process exits."""

    def __init__(self) -> None:
        super().__init__()
        self._exit_registered = False

    def keep(self, name: str, lock: Lock) -> None:
        with self.mutex:
            if not self._exit_registered:
                atexit.register(self.hand_back)
                self._exit_registered = True
        super().keep(name, lock)


sticky: OwnerLeases = _Sticky()
"""The process's sticky owner leases (``on_one_instance`` on plain functions)."""


def forget_owner_leases_in_child() -> None:
    """After fork(), in the child (``django_locks.process.AFTER_FORK``)."""
    sticky.forget_in_child()


def release_owner_leases() -> None:
    """Hand back every sticky owner lease this process holds (at exit, or in tests)."""
    sticky.hand_back()


# Leadership terms.


def announce_leadership(key: str, lock: Lock, ended: LostReason | None = None) -> None:
    """Tell the event stream a leadership began (``ended`` None) or ended (``reason=ended``):
    the one place either is told, so ``leadership_acquired`` and ``leadership_lost`` are sent
    from here only, always with the ``Locks`` class as sender (SPEC section 2)."""
    keeper = lock._keeper
    event = events.Event(
        "leadership_acquired" if ended is None else "leadership_lost",
        key,
        key,  # an election's key is written in the code: bounded, and what operators look for
        events.store_name(keeper.store),
        "leader",
        "acquired" if ended is None else ended,
        fencing_token=lock.fencing_token,
        lock=lock,
    )
    events.emit(event)


class Term:
    """One leadership term of this process on ``key``, under ``lock``: announced when it begins
    (on creation) and once when it ends (a second ``end`` announces nothing)."""

    def __init__(self, key: str, lock: Lock) -> None:
        self.key = key
        self.lock = lock
        self.ended: LostReason | None = None
        self._mutex = threading.Lock()
        announce_leadership(key, lock)

    @property
    def fencing_token(self) -> int:
        return self.lock.fencing_token

    def end(self, reason: LostReason) -> bool:
        """Announce the end of the term (``"lost"``, ``"released"`` or ``"max_hold"``); False
        when it was announced already."""
        with self._mutex:
            if self.ended is not None:
                return False
            self.ended = reason
        announce_leadership(self.key, self.lock, reason)
        return True
