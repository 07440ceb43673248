"""What ``EtcdStore`` writes: key names under the prefix, and each lease's value.

Under ``<prefix>/``: ``l/<key>`` a lease (a slot's is ``l/<key>#<n>``), ``p/<key>`` a preempt
request (the token it names), ``t/<key>`` a tick record, ``h/<id>`` one process's heartbeat (what
tells its watch that it has seen every event before a renewal: ``EtcdStore.renew_many``). A
lease's value is ``<owner> NUL <JSON>``, so that a Txn can compare the owner (``wire.owned_by``)
and a listing can show the holder; the JSON holds the holder's description, the effective ttl and,
for a key taken with permits, ``permits`` (and on a slot, ``base`` and ``permit``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

from django_locks.holders import Holder
from django_locks.stores.base import LeaseInfo

SEP = b"\x00"


@dataclasses.dataclass(frozen=True)
class Names:
    """The etcd keys of one lock key."""

    lease: bytes
    preempt: bytes
    tick: bytes


class Layout:
    """Key names under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.root = prefix.encode() + b"/"
        self.leases = self.root + b"l/"
        self.heartbeats = self.root + b"h/"
        self.ticks = self.root + b"t/"
        self.preempts = self.root + b"p/"

    def names(self, key: str) -> Names:
        raw = key.encode("utf-8")
        return Names(self.leases + raw, self.preempts + raw, self.ticks + raw)

    def key_of(self, lease: bytes) -> str | None:
        """The lock key of a lease's etcd key; ``None`` for any other key under the prefix."""
        if not lease.startswith(self.leases):
            return None
        return lease[len(self.leases) :].decode("utf-8", "replace")

    def heartbeat(self, process_id: str) -> bytes:
        return self.heartbeats + process_id.encode()


def owner_prefix(owner: str) -> bytes:
    return owner.encode("utf-8") + SEP


def value(owner: str, holder: Holder, ttl_ms: int, since_ms: int, **extra: Any) -> bytes:
    body = {
        "host": holder.host,
        "pid": holder.pid,
        "kind": holder.kind,
        "detail": holder.detail,
        "since": since_ms,
        "ttl": ttl_ms,
        **extra,
    }
    return owner_prefix(owner) + json.dumps(body, separators=(",", ":")).encode()


@dataclasses.dataclass(frozen=True)
class Record:
    """One lease as read back: its etcd key-value decoded."""

    key: str
    owner: str
    token: int
    lease: int
    body: dict[str, Any]

    @property
    def permits(self) -> int | None:
        permits = self.body.get("permits")
        return int(permits) if permits is not None else None

    @property
    def permit(self) -> int | None:
        permit = self.body.get("permit")
        return int(permit) if permit is not None else None

    @property
    def base(self) -> str | None:
        base = self.body.get("base")
        return str(base) if base is not None else None

    def since(self) -> datetime.datetime | None:
        since = self.body.get("since")
        if not isinstance(since, int):
            return None
        return datetime.datetime.fromtimestamp(since / 1000, tz=datetime.UTC)

    def holder(self, expires_at: datetime.datetime | None = None) -> Holder:
        """The holder; ``expires_at`` given, or at the latest: now plus the lease's effective
        ttl (a keepalive moves an etcd lease's expiry to its whole TTL from then, and a Txn
        cannot read a lease's time left)."""
        if expires_at is None and isinstance(self.body.get("ttl"), int):
            now = datetime.datetime.now(datetime.UTC)
            expires_at = now + datetime.timedelta(milliseconds=self.body["ttl"])
        pid = self.body.get("pid")
        return Holder(
            host=str(self.body.get("host") or "?"),
            pid=pid if isinstance(pid, int) else None,
            kind=self.body.get("kind") or "process",
            detail=str(self.body.get("detail") or ""),
            since=self.since(),
            expires_at=expires_at,
        )

    def info(
        self,
        expires_in: datetime.timedelta | None,
        last_renewed: datetime.datetime | None = None,
    ) -> LeaseInfo:
        now = datetime.datetime.now(datetime.UTC)
        expires_at = None if expires_in is None else now + expires_in
        holder = self.holder(expires_at)
        since = self.since()
        if last_renewed is not None and since is not None:
            # Worked out from etcd's whole seconds left: up to 1 s early, never before taken.
            last_renewed = max(last_renewed, since)
        return LeaseInfo(
            key=self.key,
            state="held",
            owner=self.owner,
            holder=str(holder),
            fencing_token=self.token,
            acquired_at=self.since(),
            expires_in=expires_in,
            holder_info=holder,
            last_renewed=last_renewed,
            permit=self.permit,
            permits=self.permits,
        )


def decode(layout: Layout, kv: dict[str, Any]) -> Record | None:
    """A range or watch event's key-value (``key`` and ``value`` base64), or ``None`` when it
    is not a lease of this layout or not one this store wrote."""
    import base64

    name = base64.b64decode(kv["key"])
    key = layout.key_of(name)
    raw = base64.b64decode(kv.get("value", ""))
    owner, sep, rest = raw.partition(SEP)
    if key is None or not sep:
        return None
    try:
        body = json.loads(rest)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    return Record(
        key=key,
        owner=owner.decode("utf-8", "replace"),
        token=int(kv.get("create_revision", 0)),
        lease=int(kv.get("lease", 0)),
        body=body,
    )
