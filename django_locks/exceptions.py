"""The errors django_locks raises; each carries its facts as attributes."""

from __future__ import annotations

from typing import Literal

DetectedBy = Literal["renewal", "deadline"]


class LocksError(Exception):
    """Base class of every error django_locks raises on purpose."""


class LockNotAcquiredError(LocksError):
    """The key stayed taken for the whole wait (raised by ``lock()`` and ``with_lock()``)."""

    def __init__(self, key: str, wait: float) -> None:
        self.key = key
        self.wait = wait
        waited = f"after waiting {wait:g}s" if wait else "on the first try"
        super().__init__(f"Lock {key!r} is held by another owner; not acquired {waited}.")


class LockLostError(LocksError):
    """A held lock stopped being ours before it was released.

    ``detected_by`` is ``"renewal"`` when the store refused a renewal (another owner took the key,
    or the lease had expired), ``"deadline"`` when no renewal was confirmed before the holder's
    deadline (the store was unreachable, a call hung, or the process was paused).
    """

    def __init__(self, key: str, fencing_token: int, detected_by: DetectedBy) -> None:
        self.key = key
        self.fencing_token = fencing_token
        self.detected_by = detected_by
        how = {
            "renewal": "the store refused its renewal",
            "deadline": "no renewal was confirmed before its deadline",
        }[detected_by]
        super().__init__(f"Lock {key!r} (fencing token {fencing_token}) was lost: {how}.")


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
