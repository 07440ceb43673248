"""``LockBlock``: what ``Locks.lock()`` and ``Locks.alock()`` return, holding a key a block."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from django_locks.abort import AbortSignal
from django_locks.context import _current
from django_locks.events import Use
from django_locks.exceptions import LockNotAcquiredError
from django_locks.holders import Holder
from django_locks.lock import Lock
from django_locks.on_commit import end_block, refuse_several

if TYPE_CHECKING:
    import contextvars

    from django_locks.service import Locks


class LockBlock:
    """What :meth:`Locks.lock` and :meth:`Locks.alock` return: holds the key for one block
    (with ``release="on_commit"``, until the transaction the block ended in commits)."""

    def __init__(
        self,
        locks: Locks,
        key: str,
        ttl_ms: int,
        wait_s: float,
        signal: AbortSignal | None,
        label: str | None = None,
        permits: int = 1,
        max_hold_ms: int | None = None,
        commit_alias: str | None = None,
    ) -> None:
        # Checked by lock() / alock() already: entering validates nothing again.
        # `commit_alias`: release="on_commit", following that alias's transaction (sync only).
        self._locks = locks
        self._args: tuple[str, int, float, AbortSignal | None, str | None, Use] = (
            key,
            ttl_ms,
            wait_s,
            signal,
            label,
            "lock",
        )
        self._permits = permits
        self._max_hold_ms = max_hold_ms
        self._commit_alias = commit_alias
        self._key = key
        self._lock: Lock | None = None
        self._context_token: contextvars.Token[Lock | None] | None = None

    def _entered(self, lock: Lock | Holder | None) -> Lock:
        if not isinstance(lock, Lock):
            raise LockNotAcquiredError(self._key, self._args[2], lock, self._permits)
        self._lock = lock
        self._context_token = _current.set(lock)
        return lock

    def _leaving(self) -> Lock:
        assert self._lock is not None and self._context_token is not None
        _current.reset(self._context_token)
        return self._lock

    def __enter__(self) -> Lock:
        if self._commit_alias is not None:
            refuse_several(self._commit_alias, self._key)
        found = self._locks._acquire(
            *self._args, permits=self._permits, max_hold_ms=self._max_hold_ms
        )
        return self._entered(found)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The lock's own block ends the same way: released, a failure logged, not raised.
        lock = self._leaving()
        if self._commit_alias is None:
            lock.__exit__(exc_type, exc, tb)
        else:
            end_block(lock, self._commit_alias, failed=exc_type is not None)

    async def __aenter__(self) -> Lock:
        found = await self._locks._aacquire(
            *self._args, permits=self._permits, max_hold_ms=self._max_hold_ms
        )
        return self._entered(found)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Runs to its end whatever the cancellation (see Lock.arelease).
        await self._leaving().__aexit__(exc_type, exc, tb)
