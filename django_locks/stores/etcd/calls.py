"""What every part of ``EtcdStore`` calls through: this process's clients, leases and watch."""

from __future__ import annotations

import time
import uuid

from django_locks.policy import POLICY
from django_locks.stores import runtime
from django_locks.stores.etcd import records
from django_locks.stores.etcd.leases import Granted, ProcessLeases
from django_locks.stores.etcd.records import Layout, Record
from django_locks.stores.etcd.security import Security
from django_locks.stores.etcd.watch import Watch
from django_locks.stores.etcd.wire import Json, Wire


class Process:
    """What one process keeps per store: the clients, its leases, its watch, its id (the name
    of its heartbeat key)."""

    def __init__(
        self, endpoints: list[tuple[str, str, int]], what: str, layout: Layout, security: Security
    ) -> None:
        self.wire = Wire(endpoints, what, security)
        self.leases = ProcessLeases(self.wire)
        self.watch = Watch(self.wire, layout.root, layout.leases, layout.preempts)
        self.id = uuid.uuid4().hex


class Calls:
    """The helpers the store's methods share (set up by ``EtcdStore.__init__``)."""

    layout: Layout
    timeout: float
    _process: runtime.ProcessLocal[Process]

    def _deadline(self, timeout: float | None) -> float:
        return Wire.deadline(self.timeout if timeout is None else timeout)

    @staticmethod
    def _left(deadline: float) -> float:
        return max(deadline - time.monotonic(), 0)

    def _txn(self, body: Json, deadline: float, *, again: bool = False) -> Json:
        """One Txn; ``again``: it may be applied twice, so it is sent again to the next member
        when one does not answer within ``POLICY.etcd_attempt`` (``Wire.call``)."""
        return self._process.get().wire.call("kv/txn", body, deadline, again=again)

    def _shared(self, ttl_ms: int, deadline: float) -> Granted:
        return self._process.get().leases.shared(ttl_ms, deadline)

    def _outlives(self, granted: Granted, since: float, deadline: float) -> float | None:
        """After a key was put on the shared lease ``granted`` by a call that began at
        ``since``: how long before ``since`` the key's life began (its *lag*, which the holder's
        deadline counts back by: :meth:`EtcdStore.acquired_lag`), or ``None`` when the lease had
        expired meanwhile (the key went with it: not acquired). A lease kept alive within a
        renewal period before the call leaves the key at least two thirds of its ttl, as a lock
        has just before its renewal: no request more. Else it is kept alive now (one round trip
        more: the key lives its whole ttl from ``since``). Only after a success: a failed
        acquire must not extend the process's other keys on that lease."""
        lag = since - granted.kept_at
        if lag <= 0:
            return 0.0
        if lag <= granted.ttl_s / POLICY.renew_divisor:
            return lag
        return 0.0 if self._process.get().leases.keepalive(granted, deadline) else None

    def _decoded(self, kvs: list[Json]) -> Record | None:
        return records.decode(self.layout, kvs[0]) if kvs else None
