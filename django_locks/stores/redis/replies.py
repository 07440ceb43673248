"""The Redis store's script replies read: an acquire's and a renewal's answers, a ``Holder``, a
``LeaseInfo``."""

from __future__ import annotations

import datetime
from typing import Any

from django_locks.exceptions import PermitsMismatchError
from django_locks.holders import Holder
from django_locks.stores.base import PREEMPTED, LeaseInfo, PermitGrant, Renewed


def _utc(ms: int) -> datetime.datetime:
    try:
        return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, ValueError, OSError):  # a PEXPIRE past the year 9999, set by hand
        return datetime.datetime.max.replace(tzinfo=datetime.UTC)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode(errors="replace")


def holder(
    address: bytes | None,
    kind: bytes | None,
    detail: bytes | None,
    acquired_at: bytes | None,
    pttl: int,
    now_ms: int,
) -> Holder:
    """The lease's holder from its fields (a lease of 0.1.0 has neither kind nor detail: kind
    ``process``); ``expires_at`` is the server's TIME plus the PTTL, both read in the same script
    (``None`` for a lease someone stripped of its expiry by hand)."""
    return Holder.parse(
        _text(address) or "",
        kind=_text(kind),
        detail=_text(detail),
        since=None if acquired_at is None else _utc(int(acquired_at)),
        expires_at=_utc(now_ms + pttl) if pttl >= 0 else None,
    )


def lease_info(row: list[Any]) -> LeaseInfo:
    """The describe script's reply as a ``LeaseInfo``: a slot of a key taken with permits has
    its ``permit`` and ``permits``, the key's own record (its summary) its ``permits`` only."""
    key, owner, address, token, acquired_at, kind, detail, renewed_at, *rest = row
    permit, permits, pttl, now_ms = rest
    described = holder(address, kind, detail, acquired_at, pttl, now_ms)
    return LeaseInfo(
        key=key.decode(),
        state="held",
        owner=owner.decode(),
        holder=str(described),
        fencing_token=int(token),
        acquired_at=described.since,
        # PTTL is -1 only for a lease someone stripped of its expiry by hand.
        expires_in=datetime.timedelta(milliseconds=int(pttl)) if pttl >= 0 else None,
        holder_info=described,
        last_renewed=None if renewed_at is None else _utc(int(renewed_at)),
        permit=None if permit is None else int(permit),
        permits=None if permits is None else int(permits),
    )


def taken(key: str, permits: int, reply: Any) -> int | PermitGrant | Holder | None:
    """An acquire's reply read: a token (``int``), a grant ``[token, permit]`` (a list of two
    ints), a holder's fields (a ``Holder``), ``None``; ``[b"permits", live]`` raises
    ``PermitsMismatchError`` (``key`` asked with ``permits``, its live leases using ``live``)."""
    if type(reply) is int or reply is None:
        return reply
    if len(reply) == 2:
        first, live = reply
        if first == b"permits":
            raise PermitsMismatchError(key, permits, int(live))
        return PermitGrant(int(first), int(live))
    return holder(*reply)


def renewed(reply: Any) -> Renewed:
    """The renew script's reply read: 1 renewed (``True``), 2 preempted (``PREEMPTED``: a
    request names the lease's token), anything else refused (``False``)."""
    if reply == 1:
        return True
    return PREEMPTED if reply == 2 else False
