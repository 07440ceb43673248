"""``Lock``: a held lease, renewed in the background until released or lost."""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import TYPE_CHECKING

from django_locks.abort import AbortSignal
from django_locks.aio import finish
from django_locks.durations import Duration, lease_ms
from django_locks.exceptions import StoreError
from django_locks.renewal import Keeper
from django_locks.transactions import warn_if_in_atomic

if TYPE_CHECKING:
    from django_locks.atomic import LeaseAtomic

logger = logging.getLogger("django_locks")


class Lock:
    """A lock this process holds on ``key``.

    While held it is renewed in the background every ``ttl / 3``. ``signal`` aborts when the lock
    is lost (its reason a ``LockLostError``) or released. ``fencing_token`` is greater than every
    token the key had before: pass it with the writes the lock protects (``fenced_update``).
    A ``Lock`` garbage-collected without ``release()`` stops being renewed and lapses at its ttl.
    Use it as a context manager (``with`` / ``async with``) to release it on exit.
    """

    __slots__ = ("__weakref__", "_keeper")

    def __init__(self, keeper: Keeper) -> None:
        self._keeper = keeper

    def __del__(self) -> None:
        # Garbage-collected while held: stop renewing, let it lapse (a no-op once released). At
        # interpreter exit every lease lapses anyway: no warning then.
        keeper = self._keeper
        if keeper.state == "held" and not _finalizing():
            keeper.abandon()

    @property
    def key(self) -> str:
        """The key asked for (for a permit too: its slot's key is ``<key>#<permit>``)."""
        return self._keeper.key

    @property
    def permit(self) -> int | None:
        """Which of the key's permits this is (1..permits), for a lock taken with
        ``permits=`` above 1; ``None`` for a plain lock. Its fencing token orders the holders of
        this permit only: write per-permit resources with it (see the permits topic)."""
        return self._keeper.permit

    @property
    def owner(self) -> str:
        """The unique id the store knows this holder by."""
        return self._keeper.owner

    @property
    def fencing_token(self) -> int:
        return self._keeper.fencing_token

    @property
    def ttl(self) -> float:
        """The lease's ttl in seconds."""
        return self._keeper.ttl

    @property
    def signal(self) -> AbortSignal:
        return self._keeper.signal

    @property
    def held(self) -> bool:
        """True until released or lost (or the holder deadline passed, even before it fired)."""
        return self._keeper.held

    @property
    def deadline(self) -> float:
        """The holder deadline, in the clock's monotonic seconds (moved by every renewal)."""
        return self._keeper.deadline

    def release(self) -> bool:
        """Stop renewing and free the lease at once.

        Returns ``True`` when the store confirmed the lease was still ours, ``False`` when it was
        already released or lost (no store call then). Past the holder deadline it is lost: the
        loss is announced (``lock_lost``) before ``False`` is returned. The store call takes at
        most the lock's remaining validity (at least 50 ms). Raises ``StoreError`` when the store
        cannot be reached or does not answer in that time; the lock is not renewed any more
        either way, so it lapses at its ttl. (Leaving a ``with`` block logs that error instead
        of raising it over the block's result.)
        """
        if self._keeper.state == "held":
            warn_if_in_atomic(self.key)
        return self._keeper.release()

    def leave_for(self, duration: Duration) -> bool:
        """Stop renewing, and leave the lease in the store for ``duration`` more (one renewal
        on the store's clock), after which it lapses without anybody renewing it.

        For a short-lived process that must keep others out for a while after it exits (a
        management command's ``min_hold``). Returns ``True`` when the store confirmed the lease
        was still ours; raises ``StoreError`` when the store cannot be reached. ``duration`` is
        1 ms to 366 days (``ValueError`` / ``TypeError`` otherwise, before any I/O).
        """
        return self._keeper.leave(lease_ms(duration, name="duration"))

    async def arelease(self) -> bool:
        """:meth:`release` without blocking the event loop (the store call runs in a thread).

        A cancellation does not undo it: the lock stops being renewed at once, the store call
        is under way before the first await, and a task cancelled meanwhile waits for the
        store's answer (at most the lock's remaining validity, at least 50 ms: the bound of
        every release) before ``CancelledError`` is raised, so that whoever runs next finds
        the key free. Raises ``StoreError`` as :meth:`release` does (logged instead when the
        task was cancelled).
        """
        keeper = self._keeper
        if not keeper.stop():
            return False
        return await finish(keeper.free, lambda error: release_failed(self, error))

    def atomic(self, using: str | None = None) -> LeaseAtomic:
        """An outermost ``transaction.atomic()`` block on the lock store's own database whose
        COMMIT is conditional on this lease: every write the block makes there commits before
        any next holder of the key acquires it, or not at all (``LockLostError``, rolled back).

        ``with lock.atomic():`` (sync only) yields the lock. ``using`` defaults to the
        ``DatabaseStore``'s alias and may only name it. Refused with ``ValueError`` for a lock of
        another store or a permit, with ``TransactionManagementError`` inside another atomic
        block on the alias (``ATOMIC_REQUESTS`` included) and at REPEATABLE READ or
        SERIALIZABLE, with ``ImproperlyConfigured`` on SQLite without ``transaction_mode``
        IMMEDIATE. On PostgreSQL the server ends a block stalled (idle or in one statement)
        longer than the lock's ttl. See the fencing topic."""
        from django_locks.atomic import LeaseAtomic

        return LeaseAtomic(self, using)

    def __enter__(self) -> Lock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except StoreError as error:
            release_failed(self, error)  # the block's result or exception is kept

    async def __aenter__(self) -> Lock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.arelease()
        except StoreError as error:
            release_failed(self, error)  # the block's result or exception is kept

    def __repr__(self) -> str:
        state: str = self._keeper.state
        if state == "held" and not self.held:
            state = "past its deadline"
        permit = f" permit={self.permit}" if self.permit is not None else ""
        return f"<Lock {self.key!r}{permit} token={self.fencing_token} {state}>"


def hand_back(lock: Lock, grace: float = 0.0) -> bool:
    """End ``lock`` as handed back (an owner lease or a leadership returned at shutdown): freed
    at once, or with ``grace`` seconds (1 ms or more) left in the store unrenewed. Recorded as
    ``"handed back"`` where the store keeps how leases end; answers as :meth:`Lock.release`."""
    keeper = lock._keeper
    if grace:
        return keeper.leave(lease_ms(grace, name="grace"), "handed back")
    if keeper.state == "held":
        warn_if_in_atomic(lock.key)
    return keeper.release("handed back")


def release_failed(lock: Lock, error: BaseException) -> None:
    """A release at the end of a block failed: say so, without raising over the block's result.

    Nothing was lost while the block ran (its deadline stood until the release), so no
    ``lock_lost``: the lock's signal aborted at the release, as for every release, and the lease
    keeps others out until it lapses at its ttl, unrenewed (the store may even have freed it)."""
    logger.warning(
        "Releasing lock %r failed (%s); it is no longer renewed and lapses within its ttl of %gs",
        lock.key,
        error,
        lock.ttl,
    )


_finalizing = sys.is_finalizing
