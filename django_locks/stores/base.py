"""``LockStore``: the contract every lock store fulfils (SPEC section 4), written once, here.

``django_locks.testing.LockStoreContract`` checks every rule stated below against a real store.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal, NamedTuple

from django.core.exceptions import ImproperlyConfigured

from django_locks import process
from django_locks.holders import Holder
from django_locks.stores.arguments import check_older_than as check_older_than

LeaseState = Literal["held", "expired", "released"]

EndReason = Literal["released", "handed back", "lapsed", "expired", "force released", "max hold"]
"""How a lease ended (SPEC section 8), where the store keeps ended leases."""

ReleaseReason = Literal["released", "handed back"]
"""How a holder ends its own lease at once (:meth:`LockStore.end`)."""

LeaveReason = Literal["lapsed", "handed back", "max hold"]
"""How a lease left to lapse unrenewed ends (:meth:`LockStore.leave`)."""

PREEMPTED: Final = "preempted"
"""A renewal's answer, from a store offering preempt requests: the lease carries a request
naming its token (:meth:`LockStore.preempt`). Compared by value, never by truthiness."""

Renewed = bool | Literal["preempted"]
"""One renewal's answer: renewed (``True``), refused (``False``), or :data:`PREEMPTED`."""


@dataclasses.dataclass(frozen=True)
class LeaseInfo:
    """One lease as a store lists it, for the admin and ``manage.py locks``.

    ``expires_in`` is measured on the store's own clock at listing time (negative once expired)
    and is ``None`` for released leases. ``holder`` is the one-line label of whoever took it
    ("host:pid" from a store that keeps nothing more). The fields after ``expires_in`` are new in
    0.2.0, each ``None`` unless the store fills it, so a custom store building a ``LeaseInfo``
    the old way keeps working: ``holder_info`` (a :class:`~django_locks.Holder`), ``ended`` (how
    an ended lease ended, :data:`EndReason`; ``None`` while held, and for a lease ended by a
    previous release's process, which recorded no reason), ``ended_by`` (who force-released it),
    ``last_renewed`` (UTC, on the store's clock), ``permit`` (the slot of a key taken with
    permits; its ``key`` is then the slot's, ``<key>#<n>``), ``permits`` (on a slot and on its
    key's own record: the key's permits value; the record, whose ``owner`` is
    :data:`PERMITS_OWNER` and whose ``permit`` is ``None``, is the key's summary, not a holder).
    ``owner`` is the holder's secret: nothing shows it to people.
    """

    key: str
    state: LeaseState
    owner: str
    holder: str
    fencing_token: int
    acquired_at: datetime.datetime | None
    expires_in: datetime.timedelta | None
    holder_info: Holder | None = None
    ended: EndReason | None = None
    ended_by: str | None = None
    last_renewed: datetime.datetime | None = None
    permit: int | None = None
    permits: int | None = None

    @property
    def is_summary(self) -> bool:
        """Whether this is the own record of a key taken with permits (held while any of its
        slots is), not a holder's lease."""
        return self.permits is not None and self.permit is None

    @property
    def described(self) -> Holder:
        """The holder as people read it: ``holder_info``, else parsed from ``holder``."""
        if self.holder_info is not None:
            return self.holder_info
        return Holder.parse(self.holder, since=self.acquired_at)


PERMITS_OWNER = "permits"
"""The owner recorded on the own record of a key taken with permits while any slot is live."""


class Slot(str):
    """The lease key of one permit: ``<base>#<permit>``, a ``str`` that also carries ``base``
    (the key asked for) and ``permit`` (1..permits).

    The service passes a ``Slot``, never a plain ``str``, to :meth:`LockStore.renew`,
    :meth:`~LockStore.renew_many`, :meth:`~LockStore.leave`, :meth:`~LockStore.end` and
    :meth:`~LockStore.release` for a lease :meth:`LockStore.acquire_permit` granted, so that a
    store can find the key's own record without reading the slot first (on Redis, the base
    key's hash tag). Pass ``str(slot)`` to a driver."""

    base: str
    permit: int

    def __new__(cls, base: str, permit: int) -> Slot:
        slot = super().__new__(cls, f"{base}#{permit}")
        slot.base = base
        slot.permit = permit
        return slot

    def __reduce__(self) -> tuple[Any, ...]:
        return (Slot, (self.base, self.permit))


slot_of = functools.lru_cache(maxsize=4096)(Slot)
"""``Slot(base, permit)``, the recent ones made once (what the service's permits use)."""


class PermitGrant(NamedTuple):
    """What :meth:`LockStore.acquire_permit` answers when it took a slot."""

    fencing_token: int
    permit: int


class TickRecord(NamedTuple):
    """A key's tick record (:meth:`LockStore.recorded_tick`): the last tick a beat published."""

    tick_ms: int
    """The tick's scheduled time, milliseconds since the Unix epoch (UTC)."""
    fencing_token: int
    """The token of the lease that recorded it."""


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

    def effective_ttl_ms(self, ttl_ms: int) -> int:
        """How long a lease granted for ``ttl_ms`` lives here, never less (no I/O; what renewals
        and the holder's deadline use): etcd rounds up to whole seconds and a minimum."""
        return ttl_ms

    def acquired_lag(self, key: str, owner: str) -> float:
        """No I/O, just after an acquire: seconds before its send the lease's time began (0)."""
        return 0.0

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        """Move the expiry of ``owner``'s live lease on ``key`` to ``ttl_ms`` from now.

        Returns ``True`` when renewed, ``False`` when ``owner`` holds no live lease on ``key``
        (it expired, was released, or another owner took it). An expired lease is never revived.
        A store offering preempt requests answers :data:`PREEMPTED` instead of renewing when the
        lease carries a request naming its token (:meth:`preempt`).
        """
        raise NotImplementedError

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        """Free ``owner``'s live lease on ``key`` at once, keeping the key's fencing token.

        Returns ``True`` when released, ``False`` when ``owner`` held no live lease on ``key``.
        """
        raise NotImplementedError

    # Holders and how leases end (version 3). Each default below falls back on the three methods
    # above (a store written to them records no holder description and no end reason); a store
    # that records them overrides all four and sets ``describes_holders`` (the contract checks).

    describes_holders: bool = False
    """Whether the store records the holder's description with each lease, returns the current
    holder from a failed :meth:`acquire_as`, and records how its leases ended."""

    def acquire_as(
        self, key: str, owner: str, ttl_ms: int, holder: Holder, *, timeout: float | None = None
    ) -> int | Holder | None:
        """:meth:`acquire`, recording ``holder`` (its host, pid, kind and detail; ``since`` and
        ``expires_at`` are the store's to set) with the lease. Returns the fencing token when
        taken; when another owner holds the key, that owner's :class:`Holder` (``since``, its
        ``expires_at`` on the store's clock) read in the SAME round trip, or ``None`` when the
        store cannot say. What the service calls; this default calls :meth:`acquire`."""
        return self.acquire(key, owner, ttl_ms, timeout=timeout)

    def end(
        self, key: str, owner: str, how: ReleaseReason, *, timeout: float | None = None
    ) -> bool:
        """:meth:`release`, recording ``how`` the lease ended: ``"released"`` by its holder, or
        ``"handed back"`` (an owner lease or a leadership returned at shutdown)."""
        return self.release(key, owner, timeout=timeout)

    def leave(
        self, key: str, owner: str, ttl_ms: int, how: LeaveReason, *, timeout: float | None = None
    ) -> bool:
        """:meth:`renew` to ``ttl_ms`` from now, recording that the lease, now never renewed
        again, ends then as ``how``: ``"lapsed"`` (a command's ``min_hold`` ran out after a
        clean run), ``"handed back"`` (an owner lease kept a grace period at shutdown) or
        ``"max hold"`` (the renewer's last renewal at the lock's ``max_hold``). An
        acquire or renewal afterwards clears the record."""
        return self.renew(key, owner, ttl_ms, timeout=timeout) is True

    def force_end(self, key: str, by: str) -> bool:
        """:meth:`force_release`, recording ``by`` whom ("admin alice", "cli bob@ops-1")."""
        return self.force_release(key)

    # Permits (version 3, optional). A store that offers them sets ``supports_permits`` and
    # overrides acquire_permit; LockStoreContract then checks every rule below.

    supports_permits: bool = False
    """Whether the store offers permits: :meth:`acquire_permit`, and the :class:`Slot` rules of
    the other methods below. Without it, ``permits=`` above 1 is refused naming the store."""

    def acquire_permit(
        self,
        key: str,
        owner: str,
        ttl_ms: int,
        permits: int,
        holder: Holder,
        *,
        timeout: float | None = None,
    ) -> PermitGrant | Holder | None:
        """Take one of the ``permits`` slots of ``key`` (2 to ``MAX_PERMITS``) for ``owner``,
        in ONE atomic step, recording ``holder`` as :meth:`acquire_as` does.

        * A slot is a lease of its own on the slot key ``<key>#<n>`` (:class:`Slot`), n in
          1..permits; the lowest free n is taken. Its token is drawn from the key's one growing
          sequence: greater than every token ``key`` or any of its slots ever had (the key's own
          record is the floor of all of them, and records the highest token drawn).
        * While any slot is live, the key's own record is held too: owner
          :data:`PERMITS_OWNER`, its ``permits`` value recorded, its expiry the latest of its
          slots' expiries (moved in the same step by every slot's acquire and renewal). A
          previous release's process, or a plain :meth:`acquire` of ``key``, finds it held.
        * Idempotent for the same owner: when ``owner`` holds a live slot of ``key``, it is
          extended to ``ttl_ms`` from now and the SAME grant is returned.
        * Of any number of concurrent callers, never more than ``permits`` slots are live.
        * Returns :class:`PermitGrant` ``(fencing_token, permit)`` when taken; when every slot
          is live, the :class:`Holder` of the slot whose lease ends first (read in the same
          round trip), or ``None`` when the store cannot say.
        * Raises :class:`~django_locks.exceptions.PermitsMismatchError` (nothing written) when
          the key's live leases use another permits value: a live plain lease on ``key`` (1),
          or its own record held with another ``permits``.

        The other methods, given a :class:`Slot`: :meth:`renew`, :meth:`renew_many` and
        :meth:`leave` act on that slot's lease and move the key's own record's expiry to at
        least the slot's new one; :meth:`end` and :meth:`release` free the slot, set the
        record's expiry to the latest of its other live slots' (freeing it when none is
        live), and send the release notice for ``slot.base`` (waiters wait on the base key).
        :meth:`acquire` / :meth:`acquire_as` of a key whose own record is held by permits,
        or of a slot's key (``"k#2"``, whose record names its base), raise
        ``PermitsMismatchError``. :meth:`force_end` / :meth:`force_release` of the base key
        free every slot and the record; of a slot key, that slot alone (the record following
        as for :meth:`end`). :meth:`leases` lists each slot (``key`` the slot key, ``permit``
        and ``permits`` set) and the key's record (``permits`` set, ``permit`` None);
        :meth:`lease` of either key answers that one.
        """
        raise NotImplementedError

    # Preempt requests (version 3, optional): what on_conflict="replace" writes. A store offering
    # them sets ``supports_preempt`` (a class attribute: read from the configured BACKEND without
    # building the store) and overrides preempt(); LockStoreContract checks every rule below.

    supports_preempt: bool = False
    """Whether the store offers :meth:`preempt`, and :data:`PREEMPTED` answers of renewals."""

    def preempt(self, key: str, *, timeout: float | None = None) -> int | None:
        """Ask the holder of ``key`` to give it up, in ONE atomic step: write a preempt request
        on the live lease of ``key`` naming that lease's fencing token, and return the token.
        ``None`` (nothing written) when no live lease holds ``key``. For a key held by permits,
        the request goes on its live slot with the lowest token (the oldest holder) and names
        that slot's token. Preempting the same live lease again writes the same request.

        The request is answered by the holder's renewals: :meth:`renew` and
        :meth:`renew_many` of the owner's live lease that carries a request naming ITS token
        answer :data:`PREEMPTED` and do not extend it (it lapses at its expiry unless released
        sooner). A request naming another token (one that already ended: stale) is ignored.
        An acquire that makes a new lease on the key (a new token) clears its request; the
        idempotent acquire of the same owner keeps it.
        """
        raise NotImplementedError

    # Tick records (version 3, optional): what beat writes for on_one_instance(catch_up=True).
    supports_ticks: bool = False
    """Whether the store offers :meth:`record_tick` and :meth:`recorded_tick` (class attribute)."""

    def record_tick(
        self, key: str, owner: str, tick_ms: int, *, timeout: float | None = None
    ) -> bool:
        """In ONE atomic step, when ``owner`` holds the live plain lease on ``key``, write
        ``TickRecord(tick_ms, its token)`` as the key's tick record, replacing any, and answer
        True; otherwise False, nothing written. The record survives the lease's expiry, release
        and later acquires by others (the beat taking the key over reads it after its acquire);
        :meth:`clear` removes it, and :meth:`prune` with the key's row where rows are kept."""
        raise NotImplementedError

    def recorded_tick(self, key: str, *, timeout: float | None = None) -> TickRecord | None:
        """The key's tick record, whoever wrote it; ``None`` when there is none."""
        raise NotImplementedError

    # Optional capabilities: a store without one leaves it raising NotImplementedError (skipped).

    keeps_ended_leases: bool = False
    """Whether the store keeps released and expired leases (a row per key, as the database store
    does) for :meth:`prune`; ``manage.py locks prune`` says a store that keeps none has none."""

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
    ) -> Sequence[Renewed]:
        """Renew many leases in one round trip: ``leases`` are ``(key, owner, ttl_ms)``, the
        result one ``renew()`` answer per lease, in order. Each lease is checked and renewed
        atomically on its own, exactly as ``renew()`` does; a failure of the call raises
        ``StoreError`` for all of them. The renewal mechanism uses it, when a store offers it,
        to renew every lock a process holds in one call per renewal period. A store offering
        preempt requests answers :data:`PREEMPTED` for a lease carrying one (:meth:`preempt`).
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

    def forsake(self, key: str, owner: str) -> None:
        """No I/O: ``owner``'s holder stopped renewing ``key`` without ending it (its ``Lock`` was
        garbage-collected); a store renewing many leases at once (etcd) stops renewing it too."""

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

    def __str__(self) -> str:
        """The store named for people (the admin, ``manage.py locks``, messages): each store
        says where its leases live, without I/O or secrets; by default its class's name."""
        return type(self).__qualname__


holder_name = process.holder
"""``host:pid`` of this process, as stores record a lease's holder for people reading the admin."""
MAX_ENDED_BY = 255
"""The longest ``by`` of :meth:`LockStore.force_end` kept (the database store's column)."""


def require_permits(store: LockStore, permits: int) -> None:
    """Refuse ``permits`` above 1 on a store without the capability, naming both."""
    if permits > 1 and not store.supports_permits:
        raise ImproperlyConfigured(
            f"permits={permits} needs a store offering permits, and {store} does not (an optional"
            f" capability of the store contract): use the database (PostgreSQL or SQLite), etcd,"
            f" Redis or in-memory store, or permits=1"
        )
