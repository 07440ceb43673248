"""The in-memory store's lease record (``MemoryLease``) and how a listing reads one."""

from __future__ import annotations

import dataclasses
import datetime

from django_locks.holders import Holder
from django_locks.stores.base import EndReason, LeaseInfo

# The longest expires_in a listing shows: a timedelta cannot hold more than 999,999,999 days, and a
# lease taken with a huge ttl_ms (by a caller of the store itself) must not crash leases().
_LONGEST = datetime.timedelta(days=999_999_998).total_seconds()


@dataclasses.dataclass
class MemoryLease:
    owner: str
    holder: str
    token: int
    acquired_at: datetime.datetime
    expires_at: float  # on the store's clock, in seconds (a release moves it to then)
    started: float  # the store's clock at acquired_at: expiry on the wall clock is from both
    released: bool = False
    described: Holder | None = None  # kind and detail (host and pid are in ``holder``)
    ended: EndReason | None = None  # how it ended, or how it will (left to lapse)
    ended_by: str | None = None
    renewed_at: datetime.datetime | None = None
    # The token a preempt request names: this lease's own, or None. A new lease on the key is a
    # new MemoryLease (cleared); the idempotent acquire of the same owner keeps this one (kept).
    preempt: int | None = None
    # Permits: a slot records its base key, its permit and the key's permits value; the base
    # key's own record (the summary, owner PERMITS_OWNER) records only the permits value.
    permits: int | None = None
    base: str | None = None
    permit: int | None = None

    @property
    def is_summary(self) -> bool:
        return self.permits is not None and self.base is None


def holder_of(lease: MemoryLease) -> Holder:
    """The lease's holder as people read it, ``expires_at`` on the wall clock (the same in every
    listing: counted from ``acquired_at``)."""
    try:
        expires_at = lease.acquired_at + datetime.timedelta(
            seconds=min(lease.expires_at - lease.started, _LONGEST)
        )
    except OverflowError:  # a ttl beyond the year 9999, from a caller of the store itself
        expires_at = datetime.datetime.max.replace(tzinfo=datetime.UTC)
    described = lease.described
    return Holder.parse(
        lease.holder,
        kind=described.kind if described is not None else None,
        detail=described.detail if described is not None else None,
        since=lease.acquired_at,
        expires_at=expires_at,
    )


def lease_info(key: str, lease: MemoryLease, now: float) -> LeaseInfo:
    """``lease`` on ``key`` as the store lists it, at ``now`` on the store's clock."""
    ended: EndReason | None
    if lease.released:
        state, expires_in, ended = "released", None, lease.ended
    elif lease.expires_at > now:
        state, ended = "held", None
        expires_in = datetime.timedelta(seconds=min(lease.expires_at - now, _LONGEST))
    else:
        state, ended = "expired", lease.ended or "expired"
        expires_in = datetime.timedelta(seconds=lease.expires_at - now)
    holder = holder_of(lease)
    return LeaseInfo(
        key=key,
        state=state,  # type: ignore[arg-type]
        owner=lease.owner,
        holder=str(holder),
        fencing_token=lease.token,
        acquired_at=lease.acquired_at,
        expires_in=expires_in,
        holder_info=holder,
        ended=ended,
        ended_by=lease.ended_by,
        last_renewed=lease.renewed_at,
        permit=lease.permit,
        permits=lease.permits,
    )
