"""The errors django_locks raises; each carries its facts as attributes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from django_locks.holders import Holder

DetectedBy = Literal["renewal", "deadline", "max_hold", "preempted"]


class LocksError(Exception):
    """Base class of every error django_locks raises on purpose.

    Every one pickles with its facts (its attributes, not only its message): Celery's prefork
    pool and result backends pickle the error a task failed with, and without them would
    rebuild it as the nearest class whose constructor takes the message alone.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls: type[LocksError], args: tuple[Any, ...], state: dict[str, Any]) -> LocksError:
    """An unpickled error: its message and attributes as they were, its ``__init__`` not run."""
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class LockNotAcquiredError(LocksError):
    """The key stayed taken for the whole wait (raised by ``lock()`` and ``with_lock()``).

    ``holder`` is who held it at the last try (a ``Holder``), when the store could say so in
    that same round trip, else ``None``; for a key taken with ``permits`` above 1 (also an
    attribute), the holder whose lease ends first."""

    def __init__(
        self, key: str, wait: float, holder: Holder | None = None, permits: int = 1
    ) -> None:
        self.key = key
        self.wait = wait
        self.holder = holder
        self.permits = permits
        waited = f"after waiting {wait:g}s" if wait else "on the first try"
        if permits > 1:
            first = (
                f"; the first to end is held by {holder.describe()}" if holder is not None else ""
            )
            what = f"Every one of the {permits} permits of {key!r} is taken{first}"
        else:
            by = f"held by {holder.describe()}" if holder is not None else "held by another owner"
            what = f"Lock {key!r} is {by}"
        super().__init__(f"{what}; not acquired {waited}.")


class AlreadyQueuedError(LocksError):
    """An enqueue refused: a message with the same rendered ``key`` is queued (or, with
    ``until="finished"``, running), and holds the key's enqueue-time lease. ``task`` is the task's
    name; ``holder`` who took that lease (its ``detail``: the queued message's id), when the
    store could say so in the same round trip, else ``None``. Nothing was enqueued."""

    def __init__(self, task: str, key: str, holder: Holder | None = None) -> None:
        self.task = task
        self.key = key
        self.holder = holder
        by = f" (enqueued by {holder.describe()})" if holder is not None else ""
        super().__init__(
            f"Task {task} is already queued or running under key {key!r}{by}; not enqueued "
            "again: catch AlreadyQueuedError (django.tasks: try_enqueue_unique() returns None "
            "instead), or give the task a key= that tells these calls apart."
        )


class PermitsMismatchError(LocksError):
    """One key is used with one ``permits`` value: ``key`` was asked with ``permits`` while
    its live leases use ``live`` (1: a plain lock holds it). Raised by a store offering
    permits, before anything is written; nothing was taken."""

    def __init__(self, key: str, permits: int, live: int) -> None:
        self.key = key
        self.permits = permits
        self.live = live
        super().__init__(
            f"Lock {key!r} was asked with permits={permits}, but its live leases use "
            f"permits={live}: one key is used with one permits value. Give every caller of "
            f"this key the same permits=, or wait for the live leases to end (or free them: "
            f"manage.py locks release {key!r})."
        )


class LockLostError(LocksError):
    """A held lock stopped being ours before it was released.

    ``detected_by`` is ``"renewal"`` when the store refused a renewal (another owner took the key,
    or the lease had expired), ``"deadline"`` when no renewal was confirmed before the holder's
    deadline (the store was unreachable, a call hung, or the process was paused),
    ``"max_hold"`` when the lock reached its ``max_hold`` (renewals stopped; the lease lapses at
    its ttl), ``"preempted"`` (:class:`PreemptedError`) when a replacing run asked for it.
    """

    def __init__(self, key: str, fencing_token: int, detected_by: DetectedBy) -> None:
        self.key = key
        self.fencing_token = fencing_token
        self.detected_by = detected_by
        how = {
            "renewal": "the store refused its renewal",
            "deadline": "no renewal was confirmed before its deadline",
            "max_hold": "it was held for its max_hold (renewals stopped; it lapses at its ttl)",
            "preempted": "a run with on_conflict='replace' asked for it (renewals stopped; it "
            "is released when the block ends, else lapses at its ttl)",
        }[detected_by]
        super().__init__(f"Lock {key!r} (fencing token {fencing_token}) was lost: {how}.")


class PreemptedError(LockLostError):
    """A :class:`LockLostError` with ``detected_by="preempted"``: a run of the same job with
    ``on_conflict="replace"`` asked this holder to give the key up. The holder's signal aborts
    with it; ``lock_lost`` is not sent (nothing failed). Stop the work and leave the block:
    its release hands the key to the replacing run at once."""

    def __init__(self, key: str, fencing_token: int) -> None:
        super().__init__(key, fencing_token, "preempted")


class LockReleasedError(LocksError):
    """The reason a lock's signal carries once the lock was released by its holder."""

    def __init__(self, key: str, fencing_token: int) -> None:
        self.key = key
        self.fencing_token = fencing_token
        super().__init__(f"Lock {key!r} (fencing token {fencing_token}) was released.")


class AbortedError(LocksError):
    """The default reason of an ``AbortSignal`` aborted without one."""


class StoreError(LocksError):
    """The store could not be reached or answered with an error.

    Always chained (``raise StoreError(...) from exc``) to the driver's exception. It never means
    "not acquired": a caller that cannot tell whether it holds a lock must not act as if it did
    not.
    """


class StoreTimeoutError(StoreError):
    """A store call did not answer within its timeout; its connection was discarded."""


class OwnTransactionError(StoreError):
    """The store's call would wait on the caller's own transaction, so it was not made.

    SQLite only: this thread is inside ``transaction.atomic()`` on the lock store's database
    file, and that transaction holds the file's write lock (it wrote; or, with the
    ``transaction_mode`` option IMMEDIATE or EXCLUSIVE, it began), which the store's own
    connection would wait for until its timeout. Raised at once, the message naming the fixes:
    take the lock before (or outside) the atomic block, ``@transaction.non_atomic_requests`` on
    a view under ``ATOMIC_REQUESTS``, or a PostgreSQL or Redis store. Nothing was written: an
    acquire took no lock; a release refused so leaves the lease to expire at its ttl.
    """
