"""Who owns what in this process: owner leases, leadership terms, and the runs skipped for them."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

from django_locks import signals
from django_locks.exceptions import LocksError
from django_locks.lock import Lock

if TYPE_CHECKING:
    from django_locks.service import Locks

logger = logging.getLogger("django_locks")

LostReason = Literal["lost", "released"]
ELSEWHERE = "it runs on another instance"
"""The ``reason`` of ``run_skipped`` when another process owns the job."""
IN_PROGRESS = "a run is still in progress"
"""The ``reason`` of ``run_skipped`` when the run lock is held."""


# Owner leases.


def skipped(name: str, key: str, reason: str, *, level: int = logging.INFO) -> None:
    """Log a skipped run and send ``run_skipped`` (sender: the ``Locks`` class)."""
    from django_locks.service import Locks

    logger.log(level, "Skipped %s: %s", name, reason)
    signals.send(signals.run_skipped, Locks, key=key, reason=reason)


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

    def take(self, name: str, key: str, ttl_ms: int | None = None) -> Lock | None:
        """The lease on ``key`` for the job ``name``: held already, or taken with one acquire
        (kept, logged), else None (another process holds it). ``ttl_ms``: the service's when
        None. Raises ``StoreError`` when the store fails."""
        lock = self.held(key)
        if lock is not None:
            return lock
        locks = self.service()
        lock = locks._acquire(key, locks.ttl_ms if ttl_ms is None else ttl_ms, 0.0, None)
        if lock is not None:
            self.keep(name, lock)
        return lock

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
                done = lock.leave_for(seconds) if seconds else lock.release()
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
    """Send ``leadership_acquired`` (``ended`` None) or ``leadership_lost`` with ``reason=ended``:
    the one place either is sent, always with the ``Locks`` class as sender (SPEC section 2)."""
    from django_locks.service import Locks

    if ended is None:
        signals.send(
            signals.leadership_acquired,
            Locks,
            key=key,
            fencing_token=lock.fencing_token,
            lock=lock,
        )
    else:
        signals.send(
            signals.leadership_lost,
            Locks,
            key=key,
            fencing_token=lock.fencing_token,
            reason=ended,
        )


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
        """Announce the end of the term (``"lost"`` or ``"released"``); False when it was
        announced already."""
        with self._mutex:
            if self.ended is not None:
                return False
            self.ended = reason
        announce_leadership(self.key, self.lock, reason)
        return True
