"""The etcd leases of one process: one per effective ttl for the locks it renews, kept alive by
one keepalive each, and leases of their own for locks nobody renews any more.

etcd grants a lease for whole seconds and never for less than the cluster's minimum (about 1.5 x
the election timeout: 2 s with etcd's defaults); it answers a grant with the TTL it gave, which is
how this process learns the minimum. The effective ttl of a lock is its ttl rounded up to whole
seconds and to that minimum (:meth:`ProcessLeases.effective_ms`), never down.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time

from django_locks.stores.etcd.wire import Wire


@dataclasses.dataclass
class Granted:
    id: int
    ttl_s: int
    kept_at: float  # time.monotonic() when a keepalive (or the grant) was last sent


class ProcessLeases:
    """The shared leases of this process (per store), by effective ttl in seconds."""

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self._lock = threading.Lock()
        self._by_ttl: dict[int, Granted] = {}
        self.min_ttl_s = 1  # until a grant says more

    def effective_s(self, ttl_ms: int) -> int:
        return max(math.ceil(ttl_ms / 1000), self.min_ttl_s)

    def effective_ms(self, ttl_ms: int) -> int:
        return self.effective_s(ttl_ms) * 1000

    def shared(self, ttl_ms: int, deadline: float) -> Granted:
        """The lease this process renews for ``ttl_ms`` (granted on first use)."""
        ttl_s = self.effective_s(ttl_ms)
        with self._lock:
            granted = self._by_ttl.get(ttl_s)
        if granted is not None:
            return granted
        granted = self.grant(ttl_s, deadline)
        with self._lock:
            # Another thread may have granted one meanwhile: keep the first (this one lapses).
            granted = self._by_ttl.setdefault(granted.ttl_s, granted)
            if ttl_s != granted.ttl_s:
                self._by_ttl.setdefault(ttl_s, granted)
        return granted

    def grant(self, ttl_s: int, deadline: float) -> Granted:
        """A new lease of ``ttl_s`` seconds (or the cluster's minimum), nobody's to renew."""
        sent = time.monotonic()
        # Sent again when unanswered: a second lease granted is nobody's and lapses.
        reply = self._wire.call("lease/grant", {"TTL": ttl_s, "ID": 0}, deadline, again=True)
        given = int(reply["TTL"])
        if given > ttl_s:
            self.min_ttl_s = max(self.min_ttl_s, given)
        return Granted(int(reply["ID"]), given, sent)

    def by_id(self, lease_id: int) -> Granted | None:
        """The shared lease ``lease_id``, or ``None`` when it is not one of this process's."""
        with self._lock:
            return next((held for held in self._by_ttl.values() if held.id == lease_id), None)

    def forget(self, granted: Granted) -> None:
        """Drop a shared lease etcd no longer has (it expired): the next use grants another."""
        with self._lock:
            for ttl_s, held in list(self._by_ttl.items()):
                if held.id == granted.id:
                    del self._by_ttl[ttl_s]

    def keepalive(self, granted: Granted, deadline: float) -> bool:
        """One keepalive: ``True`` when etcd moved the lease's expiry to its TTL from now,
        ``False`` when the lease is gone (it expired: every key on it went with it)."""
        sent = time.monotonic()
        reply = self._wire.call("lease/keepalive", {"ID": str(granted.id)}, deadline, again=True)
        ttl = int(reply.get("result", reply).get("TTL", 0) or 0)
        if ttl <= 0:
            self.forget(granted)
            return False
        granted.kept_at = sent
        return True

    def left_s(self, granted: Granted) -> float:
        """Seconds the lease has left at least, by this process's clock."""
        return granted.ttl_s - (time.monotonic() - granted.kept_at)
