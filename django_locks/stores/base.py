"""``LockStore``: the contract every lock store fulfils (SPEC section 4), written once, here.

``django_locks.testing.LockStoreContract`` checks every rule stated below against a real store.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from django_locks import process

LeaseState = Literal["held", "expired", "released"]


@dataclasses.dataclass(frozen=True)
class LeaseInfo:
    """One lease as a store lists it, for the admin and ``manage.py locks``.

    ``expires_in`` is measured on the store's own clock at listing time (negative once expired)
    and is ``None`` for released leases. ``holder`` is a readable "host:pid" of whoever took it.
    """

    key: str
    state: LeaseState
    owner: str
    holder: str
    fencing_token: int
    acquired_at: datetime.datetime | None
    expires_in: datetime.timedelta | None


class LockStore:
    """A place every instance of a project shares, holding one lease per key.

    Three operations, each ONE atomic step on the store (a single SQL statement, a single Lua
    script): the ownership check is inside the writing step, never a read followed by a write.

    Rules every implementation keeps:

    * Expiry is measured on the store's clock (``clock_timestamp()`` on PostgreSQL, ``PX`` on
      Redis), never the client's. An expired lease does not exist for any method.
    * ``ttl_ms`` is a positive ``int`` of milliseconds and may be weeks long.
    * Every key has a fencing token that only grows: each successful ``acquire`` returns a token
      greater than every token the key ever had (across release, expiry, restarts as far as the
      store keeps its committed writes). ``release`` never resets it.
    * Keys are ``str`` of 1 to 500 characters, any Unicode but NUL and lone surrogates, compared
      exactly (no case folding, no normalisation).
    * ``timeout`` (seconds, or ``None`` for the store's own default) bounds one call. A call still
      running at its timeout is abandoned, its connection discarded, and ``StoreTimeoutError`` is
      raised. Any other failure to reach the store raises ``StoreError`` chained to the driver's
      error: a failure is never reported as "not acquired" or "not renewed".
    * Methods are safe to call from any thread. Instances are built without I/O (they connect on
      first use) and are safe across ``fork()``: a child never uses or closes the parent's
      connections.
    """

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        """Take ``key`` for ``owner`` for ``ttl_ms`` milliseconds.

        Succeeds when no live lease holds the key (none ever, released, or expired) and returns
        the new fencing token; returns ``None`` when another owner's live lease holds it. Of any
        number of concurrent callers exactly one wins. Idempotent for the same owner: when
        ``owner`` already holds the key, the lease is extended to ``ttl_ms`` from now and the SAME
        token is returned (a retry after a timeout must not strand the lease).
        """
        raise NotImplementedError

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> bool:
        """Move the expiry of ``owner``'s live lease on ``key`` to ``ttl_ms`` from now.

        Returns ``True`` when renewed, ``False`` when ``owner`` holds no live lease on ``key``
        (it expired, was released, or another owner took it). An expired lease is never revived.
        """
        raise NotImplementedError

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        """Free ``owner``'s live lease on ``key`` at once, keeping the key's fencing token.

        Returns ``True`` when released, ``False`` when ``owner`` held no live lease on ``key``.
        """
        raise NotImplementedError

    # Optional capabilities. A store without one leaves the method raising NotImplementedError;
    # LockStoreContract skips the matching cases with a reason.

    keeps_ended_leases: bool = False
    """Whether the store keeps the records of released and expired leases (one row per key, as
    the database store does) for :meth:`prune` to delete. ``manage.py locks prune`` says there is
    nothing to prune in a store that keeps none."""

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        """List leases, held ones first then by key; with ``include_inactive`` also expired and
        released ones, where the store keeps them."""
        raise NotImplementedError

    def lease(self, key: str, *, include_inactive: bool = False) -> LeaseInfo | None:
        """The lease on ``key`` as :meth:`leases` would list it, or ``None`` when there is none:
        its live lease, or with ``include_inactive`` also an expired or released one where the
        store keeps it. For the admin, ``locks release`` and the decorators' "held by" lines,
        which describe one key: a store answers it in one round trip, never by listing every
        lease. This default looks the key up in :meth:`leases` (so a store that can only list
        still describes a key); raises ``NotImplementedError`` when the store cannot list.
        """
        for info in self.leases(include_inactive=include_inactive):
            if info.key == key:
                return info
        return None

    def prune(self, older_than_ms: int, *, dry_run: bool = False) -> int:
        """Delete the records of leases that ended (released or expired) more than
        ``older_than_ms`` milliseconds ago on the store's clock; never a live lease. No key's
        fencing token goes back: a key acquired again after its record was pruned still gets a
        token greater than every token it ever had. Returns how many records were deleted (with
        ``dry_run``: would be, deleting none). A store that keeps no ended leases returns 0.
        ``older_than_ms`` is an ``int`` of milliseconds, 0 or more (0: every ended lease); any
        other value raises ``TypeError`` / ``ValueError`` before any I/O
        (:func:`check_older_than`).
        """
        raise NotImplementedError

    def clear(self) -> None:
        """Testing aid: free every lease at once, keeping every key's fencing token."""
        raise NotImplementedError

    def force_release(self, key: str) -> bool:
        """Operator action: free whoever holds ``key`` (keeping its token). ``True`` if one did."""
        raise NotImplementedError

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> list[bool]:
        """Renew many leases in one round trip: ``leases`` are ``(key, owner, ttl_ms)``, the
        result one ``renew()`` answer per lease, in order. Each lease is checked and renewed
        atomically on its own, exactly as ``renew()`` does; a failure of the call raises
        ``StoreError`` for all of them. The renewal mechanism uses it, when a store offers it,
        to renew every lock a process holds in one call per renewal period.
        """
        raise NotImplementedError

    def warp(self, delta_ms: int) -> None:
        """Testing aid: time travel. Move every live lease's expiry ``delta_ms`` milliseconds
        earlier, as if the store's clock had run that much further: a lease with less than
        ``delta_ms`` left is then expired (exactly as by its ttl: no release notice, its token
        kept). Released and expired leases are untouched. ``ManualClock`` calls it for the stores
        attached to it (``ManualClock(stores=[store])``) each time its time moves, so expiry and
        takeover tests on a server store need no sleeping. Never call it in production.
        """
        raise NotImplementedError

    def wait_for_release(self, key: str, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a notice that ``key`` was released.

        Returns ``True`` when woken by a release of ``key`` (the key may be taken again already:
        the caller tries ``acquire``), ``False`` at the timeout. Spurious ``True`` is allowed;
        expiry sends no notice, so callers keep polling at their own pace. Stores without
        notifications raise ``NotImplementedError`` and waiters sleep through their backoff.
        """
        raise NotImplementedError

    # Life cycle and diagnostics.

    def close(self) -> None:
        """Close the connections this process opened (the next call reconnects)."""

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[Any]:
        """System-check messages, with the store's own ids, about ``options`` that keep the store
        from being built (no I/O). Shown instead of the generic ``django_locks.E001``."""
        return []

    def check(self, *, databases: Iterable[str] | None = None, deploy: bool = False) -> list[Any]:
        """System-check messages about this store's configuration (``django.core.checks``).

        Checks that need I/O run only when ``databases`` is given (``check --database``) or with
        ``deploy``; they use short timeouts and report problems as warnings.
        """
        return []

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


holder_name = process.holder
"""``host:pid`` of this process, as stores record a lease's holder for people reading the admin."""


def check_older_than(older_than_ms: object) -> int:
    """``older_than_ms`` of :meth:`LockStore.prune`, checked: an ``int`` of 0 or more."""
    if isinstance(older_than_ms, bool) or not isinstance(older_than_ms, int):
        raise TypeError(f"`older_than_ms` must be an int of milliseconds, got {older_than_ms!r}")
    if older_than_ms < 0:
        raise ValueError(f"`older_than_ms` must be 0 or more, got {older_than_ms!r}")
    return older_than_ms
