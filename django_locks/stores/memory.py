"""``InMemoryStore``: leases in this process's memory. Protects one process only."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Sequence

from django_locks.clock import Clock
from django_locks.exceptions import PermitsMismatchError
from django_locks.holders import Holder
from django_locks.keys import check_permits
from django_locks.stores.base import (
    MAX_ENDED_BY,
    PERMITS_OWNER,
    PREEMPTED,
    EndReason,
    LeaseInfo,
    LeaveReason,
    LockStore,
    PermitGrant,
    ReleaseReason,
    Renewed,
    TickRecord,
    check_older_than,
    holder_name,
)
from django_locks.stores.memory_leases import MemoryLease, holder_of, lease_info
from django_locks.stores.ticks import check_tick_ms


class InMemoryStore(LockStore):
    """Leases in a dict guarded by a mutex; the store's clock is ``clock`` (default: the system's).

    Useful for tests and development. Refused at startup while ``DEBUG`` is False unless
    ``LOCKS["ALLOW_IN_MEMORY_STORAGE"]`` is set, since every process has its own. The reference
    store of the contract: every rule is one step under the one mutex.
    """

    takes_clock = True
    """Its leases run on its clock: ``LOCKS["CLOCK"]`` is passed as its ``clock`` option (a
    ``ManualClock`` moves them by moving, not by ``warp()``)."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"`clock` must be a django_locks Clock, got {clock!r}")
        self._clock = clock
        self._mutex = threading.Lock()
        self._released = threading.Condition(self._mutex)
        self._releases: dict[str, int] = {}  # per key: how many releases so far
        self._leases: dict[str, MemoryLease] = {}
        self._ticks: dict[str, TickRecord] = {}  # per key, apart from its leases: they outlive them
        self._floor = 0  # the highest token of a pruned lease: every new token is above it

    def __str__(self) -> str:
        return "in-memory store (this process only)"

    def _now(self) -> float:
        return self._clock.monotonic() if self._clock is not None else time.monotonic()

    def _live(self, key: str, now: float) -> MemoryLease | None:
        lease = self._leases.get(key)
        if lease is None or lease.released or lease.expires_at <= now:
            return None
        return lease

    def _owned(self, key: str, owner: str, now: float) -> MemoryLease | None:
        """``owner``'s live lease on ``key``; a key's summary is nobody's to renew or end."""
        lease = self._live(key, now)
        if lease is None or lease.owner != owner or lease.is_summary:
            return None
        return lease

    def _next_token(self, *keys: str) -> int:
        """Above every token ``keys`` ever had: their records', or a pruned one's (the floor)."""
        return max([self._floor] + [self._leases[k].token for k in keys if k in self._leases]) + 1

    describes_holders = True

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        taken = self._take(key, owner, ttl_ms, None)
        return taken if isinstance(taken, int) else None

    def acquire_as(
        self, key: str, owner: str, ttl_ms: int, holder: Holder, *, timeout: float | None = None
    ) -> int | Holder | None:
        return self._take(key, owner, ttl_ms, holder)

    def _take(self, key: str, owner: str, ttl_ms: int, holder: Holder | None) -> int | Holder:
        with self._mutex:
            now = self._now()
            lease = self._live(key, now)
            if lease is not None and lease.permits is not None:
                # A key held by permits, or one permit's slot key: never a plain lock's.
                raise PermitsMismatchError(key, 1, lease.permits)
            if lease is not None:
                if lease.owner != owner:
                    return holder_of(lease)
                lease.expires_at = now + ttl_ms / 1000
                lease.ended = None
                if holder is not None:
                    # The same owner, perhaps another process (an enqueue-time lease taken over
                    # by its run): the lease describes who holds it now.
                    lease.holder, lease.described = holder.address, holder
                return lease.token
            token = self._next_token(key)
            self._leases[key] = MemoryLease(
                owner=owner,
                holder=holder.address if holder is not None else holder_name(),
                token=token,
                acquired_at=datetime.datetime.now(datetime.UTC),
                expires_at=now + ttl_ms / 1000,
                started=now,
                described=holder,
            )
            return token

    supports_permits = True

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
        if check_permits(permits) < 2:
            raise ValueError(f"`permits` of acquire_permit() must be 2 or more, got {permits!r}")
        with self._mutex:
            now = self._now()
            summary = self._live(key, now)
            if summary is not None and (not summary.is_summary or summary.permits != permits):
                # A plain lease (or a slot: one lease too) counts as permits=1.
                live = summary.permits if summary.is_summary else 1
                raise PermitsMismatchError(key, permits, live or 1)
            free, taken = None, []
            for permit in range(1, permits + 1):
                slot = self._live(f"{key}#{permit}", now)
                if slot is None:
                    free = free or permit
                elif slot.owner == owner and slot.base == key:  # a retry: the same grant
                    slot.expires_at = now + ttl_ms / 1000
                    slot.ended = None
                    self._follow(slot, now)
                    return PermitGrant(slot.token, permit)
                else:
                    taken.append(slot)
            if free is None:
                return holder_of(min(taken, key=lambda slot: slot.expires_at))
            name = f"{key}#{free}"
            token = self._next_token(key, name)
            acquired_at = datetime.datetime.now(datetime.UTC)
            expires_at = now + ttl_ms / 1000
            self._leases[name] = MemoryLease(
                owner=owner,
                holder=holder.address,
                token=token,
                acquired_at=acquired_at,
                expires_at=expires_at,
                started=now,
                described=holder,
                permits=permits,
                base=key,
                permit=free,
            )
            if summary is None:
                summary = self._leases[key] = MemoryLease(
                    owner=PERMITS_OWNER,
                    holder=holder_name(),
                    token=token,
                    acquired_at=acquired_at,
                    expires_at=expires_at,
                    started=now,
                    permits=permits,
                )
            summary.token = token  # the floor of every slot: the highest token drawn
            summary.expires_at = max(summary.expires_at, expires_at)
            return PermitGrant(token, free)

    def _follow(self, slot: MemoryLease, now: float) -> None:
        """A slot's expiry moved: its key's summary lasts as long as its latest live slot
        (found among them all only when this one's moved earlier than the summary's)."""
        if slot.base is None:
            return
        summary = self._leases[slot.base]  # live while any of its slots is
        if slot.expires_at >= summary.expires_at:
            summary.expires_at = slot.expires_at
        else:
            summary.expires_at = max(s.expires_at for s in self._slots(slot.base, summary, now))

    def _slots(self, base: str, summary: MemoryLease, now: float) -> list[MemoryLease]:
        """The live slots of ``base``, whose summary is ``summary``."""
        assert summary.permits is not None
        names = (f"{base}#{permit}" for permit in range(1, summary.permits + 1))
        return [s for name in names if (s := self._live(name, now)) and s.base == base]

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        with self._mutex:
            now = self._now()
            lease = self._owned(key, owner, now)
            if lease is None:
                return False
            if lease.preempt == lease.token:  # asked to give it up: not extended
                return PREEMPTED
            lease.expires_at = now + ttl_ms / 1000
            lease.renewed_at = datetime.datetime.now(datetime.UTC)
            lease.ended = None
            self._follow(lease, now)
            return True

    def leave(
        self, key: str, owner: str, ttl_ms: int, how: LeaveReason, *, timeout: float | None = None
    ) -> bool:
        with self._mutex:
            now = self._now()
            lease = self._owned(key, owner, now)
            if lease is None:
                return False
            lease.expires_at = now + ttl_ms / 1000
            lease.ended = how
            self._follow(lease, now)
            return True

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> list[Renewed]:
        return [self.renew(key, owner, ttl_ms) for key, owner, ttl_ms in leases]

    supports_preempt = True

    def preempt(self, key: str, *, timeout: float | None = None) -> int | None:
        with self._mutex:
            now = self._now()
            lease = self._live(key, now)
            if lease is not None and lease.is_summary:  # permits: the oldest live slot
                lease = min(self._slots(key, lease, now), key=lambda s: s.token, default=None)
            if lease is None:
                return None
            lease.preempt = lease.token
            return lease.token

    supports_ticks = True

    def record_tick(
        self, key: str, owner: str, tick_ms: int, *, timeout: float | None = None
    ) -> bool:
        check_tick_ms(tick_ms)
        with self._mutex:
            lease = self._owned(key, owner, self._now())
            if lease is None or lease.permits is not None:  # a permit's slot: never a tick's
                return False
            self._ticks[key] = TickRecord(tick_ms, lease.token)
            return True

    def recorded_tick(self, key: str, *, timeout: float | None = None) -> TickRecord | None:
        with self._mutex:
            return self._ticks.get(key)

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        return self.end(key, owner, "released")

    def end(
        self, key: str, owner: str, how: ReleaseReason, *, timeout: float | None = None
    ) -> bool:
        with self._mutex:
            lease = self._owned(key, owner, self._now())
            if lease is None:
                return False
            self._end(key, lease, how)
            return True

    def _end(self, key: str, lease: MemoryLease, how: EndReason, by: str | None = None) -> None:
        """End ``lease`` on ``key``; a slot's summary then lasts as long as its other live slots
        (ended with the last one). The notice is the base key's: waiters wait on it."""
        self._mark_released(lease.base or key, lease, how, by)
        if lease.base is None:
            return
        now = self._now()
        summary = self._live(lease.base, now)
        if summary is None:
            return
        others = self._slots(lease.base, summary, now)
        if others:
            summary.expires_at = max(slot.expires_at for slot in others)
        else:  # (the slot's notice was the key's already)
            self._mark_released(lease.base, summary, how, by, notify=False)

    def _mark_released(
        self,
        notice: str,
        lease: MemoryLease,
        how: EndReason,
        by: str | None = None,
        *,
        notify: bool = True,
    ) -> None:
        lease.released = True
        lease.ended = how
        lease.ended_by = by
        lease.expires_at = min(lease.expires_at, self._now())  # when it ended, for prune()
        if notify:
            self._releases[notice] = self._releases.get(notice, 0) + 1
            self._released.notify_all()

    def wait_for_release(self, key: str, timeout: float) -> bool:
        with self._mutex:
            seen = self._releases.get(key, 0)
            return self._released.wait_for(
                lambda: self._releases.get(key, 0) != seen, timeout=max(timeout, 0)
            )

    def force_release(self, key: str) -> bool:
        return self.force_end(key, "")

    def force_end(self, key: str, by: str) -> bool:
        with self._mutex:
            now = self._now()
            lease = self._live(key, now)
            if lease is None:
                return False
            ended_by = by[:MAX_ENDED_BY] or None
            if lease.is_summary:  # the base key of permits: every slot, then the summary
                for slot in self._slots(key, lease, now):
                    self._mark_released(key, slot, "force released", ended_by)
            self._end(key, lease, "force released", ended_by)
            return True

    def warp(self, delta_ms: int) -> None:
        with self._mutex:
            now = self._now()
            for key in list(self._leases):
                if self._live(key, now) is not None:
                    self._leases[key].expires_at -= delta_ms / 1000

    def clear(self) -> None:
        with self._mutex:
            for key, lease in self._leases.items():
                if not lease.released:
                    self._mark_released(lease.base or key, lease, "force released", "locks.clear()")
            self._ticks.clear()

    keeps_ended_leases = True  # a released or expired lease stays, as its key's token floor

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        with self._mutex:
            now = self._now()
            listed = [lease_info(key, lease, now) for key, lease in self._leases.items()]
        listed = [info for info in listed if include_inactive or info.state == "held"]
        listed.sort(key=lambda info: (info.state != "held", info.key))
        return listed

    def lease(self, key: str, *, include_inactive: bool = False) -> LeaseInfo | None:
        with self._mutex:
            lease = self._leases.get(key)
            info = None if lease is None else lease_info(key, lease, self._now())
        return info if info is not None and (include_inactive or info.state == "held") else None

    def prune(self, older_than_ms: int, *, dry_run: bool = False, prefix: str = "") -> int:
        """:meth:`LockStore.prune`; ``prefix``: only the records of keys starting with it
        (compared exactly: what ``Locks.prune()`` of a key prefix calls)."""
        check_older_than(older_than_ms)
        with self._mutex:
            # A lease ended at its expires_at (a release moves it there): a live one's is ahead.
            before = self._now() - older_than_ms / 1000
            ended = [
                key
                for key, lease in self._leases.items()
                if lease.expires_at < before and key.startswith(prefix)
            ]
            if not dry_run:
                for key in ended:
                    # The floor first: the pruned key starts over above every token it had.
                    self._floor = max(self._floor, self._leases.pop(key).token)
                    self._ticks.pop(key, None)  # with the key's record, as rows are pruned
            return len(ended)
