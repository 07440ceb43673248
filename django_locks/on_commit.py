"""``release="on_commit"``: a block's lock released right after the transaction it ended in
commits, and at once when Django discards that commit's callback (SPEC section 13).

Django has no rollback hook: it runs ``on_commit`` callbacks after the commit and drops them unrun
when the transaction or an enclosing savepoint rolls back or the connection closes. So the release
is registered with ``transaction.on_commit(..., robust=True)`` and a ``weakref.finalize`` on the
registered callback sees it dropped. The callback holds the ``Lock`` (renewed meanwhile); what the
finalizer holds releases it but never references the callback. A timer of the lock's clock backs
the finalizer up: a callback dropped from the connection's list but kept alive elsewhere (the
traceback of an earlier callback that raised, a log record holding it) is released all the same.
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.transaction import TransactionManagementError

from django_locks.exceptions import StoreError
from django_locks.lock import release_failed
from django_locks.policy import POLICY
from django_locks.transactions import atomic_aliases

if TYPE_CHECKING:
    from django_locks.clock import TimerHandle
    from django_locks.lock import Lock
    from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")

Release = Literal["on_exit", "on_commit"]
"""When a block's lock is released: as the block ends, or once its transaction commits."""


def check_release(release: object, using: object) -> bool:
    """Whether ``release`` is ``"on_commit"``. ``ValueError`` naming the argument for any other
    value than ``"on_exit"`` and ``"on_commit"``, for ``using`` not an alias of ``DATABASES``,
    and for ``using`` with ``"on_exit"`` (where it would mean nothing). No I/O."""
    if type(release) is not str or release not in ("on_exit", "on_commit"):
        raise ValueError(f"`release` must be 'on_exit' or 'on_commit', got {release!r}")
    if using is not None:
        if release == "on_exit":
            raise ValueError(
                f"`using` names the database alias whose transaction release='on_commit' "
                f"follows; with release='on_exit' leave it None, got {using!r}"
            )
        aliases = list(connections.settings)
        if type(using) is not str or using not in aliases:
            raise ValueError(f"`using` must be an alias of DATABASES {aliases}, got {using!r}")
    return release == "on_commit"


def refuse_async(release: object, using: object, form: str) -> None:
    """The async forms take ``release="on_exit"`` only (``form``: the one called, for the
    message): ``TypeError`` for ``"on_commit"``, ``ValueError`` as :func:`check_release`."""
    if check_release(release, using):
        raise TypeError(
            f"{form} cannot release on commit (release='on_commit'): Django has no async "
            "transaction.atomic(), so a coroutine's block ends inside no transaction whose "
            "commit could release it. Take the lock in the synchronous code that opens the "
            "transaction (lock() or with_lock(), or a sync function under sync_to_async), or "
            "leave release='on_exit'."
        )


def commit_alias(store: LockStore, using: str | None) -> str:
    """The alias whose transaction a ``release="on_commit"`` block follows: ``using``, else a
    ``DatabaseStore``'s own alias, else ``DEFAULT_DB_ALIAS`` (as ``on_commit`` itself)."""
    if using is not None:
        return using
    from django_locks.stores.database import DatabaseStore

    return store.using if isinstance(store, DatabaseStore) else DEFAULT_DB_ALIAS


def refuse_several(alias: str, key: str) -> None:
    """Refuse to take ``key`` to release on ``alias``'s commit while this thread is inside
    transactions on other aliases too (``TransactionManagementError``, before any I/O)."""
    others = _others(alias)
    if others:
        raise TransactionManagementError(_several(key, alias, others, "is taken"))


def end_block(
    lock: Lock, alias: str, *, failed: bool, end: Callable[[], None] | None = None
) -> None:
    """End ``lock``'s block under ``release="on_commit"``, following ``alias``'s transaction.

    Outside any atomic block on ``alias``: at once, as Django's ``on_commit`` would. Inside
    one: once it commits, or at once when Django drops the callback. Inside transactions on
    other aliases too: at once, and ``TransactionManagementError`` (logged instead when the
    block raised: ``failed``, its own exception is never masked). ``end``: what ends the lease
    (default: its release, a store failure logged, never raised)."""
    finish = end if end is not None else functools.partial(_release, lock)
    conn = connections[alias]
    if not conn.in_atomic_block:
        if end is None:
            lock.__exit__(None, None, None)  # with the warning when other aliases are in one
        else:
            end()
        return
    others = _others(alias)
    if others:
        finish()
        message = _several(lock.key, alias, others, "ended")
        if failed:
            logger.error(message)
            return
        raise TransactionManagementError(message)
    _Pending(lock, finish).arm(conn)


class _Pending:
    """A lock waiting for its transaction's end: the target of the callback Django keeps, and
    of the finalizer that sees that callback dropped. It never references the callback."""

    __slots__ = (
        "__weakref__",
        "_callback",
        "_conn",
        "_done",
        "_finish",
        "_keeper",
        "_thread",
        "_timer",
    )

    def __init__(self, lock: Lock, finish: Callable[[], None]) -> None:
        self._finish = finish  # holds the lock: renewed until the transaction ends
        self._done = False
        self._thread = threading.get_ident()
        self._callback: weakref.ref[Callable[[], None]] | None = None
        self._conn: weakref.ref[Any] | None = None
        self._timer: TimerHandle | None = None
        self._keeper = lock._keeper

    def arm(self, conn: Any) -> None:
        pending = self

        def release_after_commit() -> None:
            pending.finish()

        with _finishing:
            _watch_collections(1)
        weakref.finalize(release_after_commit, self.discarded)
        self._callback = weakref.ref(release_after_commit)
        self._conn = weakref.ref(conn)
        transaction.on_commit(release_after_commit, using=conn.alias, robust=True)
        self._watch_later()

    def finish(self) -> None:
        """End the lease now (once: the commit, the finalizer and the timer may all ask)."""
        with _finishing:
            if self._done:
                return
            self._done = True
            _watch_collections(-1)
        if self._timer is not None:
            self._timer.cancel()
        self._finish()

    def discarded(self) -> None:
        """Django dropped the callback: end the lease at once. In this thread when Django's
        own code dropped it (a rollback, a close); from the clock's background otherwise (a
        garbage collection may run anywhere, any lock held), and while this thread's open
        transaction holds the SQLite write lock the release would wait for."""
        if threading.get_ident() == self._thread and not _collecting and not self._must_wait():
            self.finish()
        else:
            self._keeper.clock.spawn(self.finish)

    def _must_wait(self) -> bool:
        from django_locks.stores.database import DatabaseStore

        store = self._keeper.store
        if not isinstance(store, DatabaseStore):
            return False
        wrapper: Any = connections[store.using]
        if wrapper.vendor != "sqlite":
            return False
        if wrapper.is_in_memory_db():
            # The store calls through this thread's own connection (the in-memory test
            # database has no other): from the background the release would interleave with
            # Django's next statement on it (the savepoint's release), "no such savepoint".
            return False
        from django_locks.stores.database.sqlite_atomic import open_transaction

        own = open_transaction(store.using)
        return own is not None and not own.testcase

    def _watch_later(self) -> None:
        clock = self._keeper.clock
        when = clock.monotonic() + POLICY.period(self._keeper.ttl)
        self._timer = clock.call_at(when, self._watch)

    def _watch(self) -> None:
        # A timer's callback (quick, no I/O): still in the connection's list, it waits on;
        # dropped from it (whatever keeps it alive), the transaction ended: release.
        if self._done or self._keeper.state != "held":
            return
        callback = self._callback() if self._callback is not None else None
        conn = self._conn() if self._conn is not None else None
        if (
            callback is not None
            and conn is not None
            and any(entry[1] is callback for entry in conn.run_on_commit)
        ):
            self._watch_later()
            return
        self._keeper.clock.spawn(self.finish)


_finishing = threading.Lock()

# Whether a garbage collection is running (a finalizer then runs wherever it was triggered),
# watched only while some lock waits for its transaction: a callback on every collection costs a
# process holding 10,000 locks about half its renewal CPU (tests/test_scale.py).
_collecting = False
_pending = 0


def _on_gc(phase: str, info: dict[str, int]) -> None:
    global _collecting
    _collecting = phase == "start"


def _watch_collections(change: int) -> None:
    """One more (``1``) or one fewer (``-1``) lock waiting; call with ``_finishing`` held."""
    global _collecting, _pending
    _pending += change
    if change > 0 and _pending == 1:
        gc.callbacks.append(_on_gc)
    elif _pending == 0 and _on_gc in gc.callbacks:
        gc.callbacks.remove(_on_gc)
        _collecting = False


def _release(lock: Lock) -> None:
    """Release ``lock`` as a block's end does, without the inside-atomic() warning: this is
    the release that waited for the commit (or for the rollback that made it safe)."""
    try:
        lock._keeper.release()
    except StoreError as error:
        release_failed(lock, error)


def _others(alias: str) -> list[str]:
    """The other aliases this thread is in a real atomic block on, when it is in one on
    ``alias`` (a ``TestCase``'s own there counts: its rollback or capture ends the block)."""
    if not connections[alias].in_atomic_block:
        return []
    return [other for other in atomic_aliases() if other != alias]


def _several(key: str, alias: str, others: list[str], how: str) -> str:
    names = ", ".join(repr(other) for other in others)
    done = "" if how == "is taken" else " It was released at once."
    return (
        f"Lock {key!r} {how} with release='on_commit' inside transaction.atomic() on the "
        f"database {alias!r} and on {names} too: release='on_commit' follows one alias's "
        f"transaction, and which commit makes the block's writes visible is not known.{done} "
        "End the block inside one alias's atomic block (commit the others' first), pass "
        "using= the alias whose commit should release it with no other transaction open, or "
        "take the lock outside the transactions with release='on_exit'."
    )
