"""``EtcdStore``'s tick records: ``<prefix>/t/<key>``, on no etcd lease (so a record outlives
the lease that wrote it), valued ``{"tick": <ms>, "token": <the lease's token>}``."""

from __future__ import annotations

import json

from django_locks.stores.base import TickRecord
from django_locks.stores.etcd import permit_ops as pops
from django_locks.stores.etcd import wire as ops
from django_locks.stores.etcd.calls import Calls
from django_locks.stores.ticks import check_tick_ms

TRIES = 3
"""Txns a record_tick may send: the owner's lease read again when the token it compared was not
the key's (a lease this process did not know, or knew from before)."""


class Ticks(Calls):
    """``record_tick`` and ``recorded_tick``."""

    supports_ticks = True

    def record_tick(
        self, key: str, owner: str, tick_ms: int, *, timeout: float | None = None
    ) -> bool:
        """ONE Txn where this process holds the lease (its token known from the acquire):
        the record put when the key is ``owner``'s plain lease (neither a slot nor a key's own
        record: compared on the value's start) with that token; else the lease read first (its
        token), then that Txn."""
        check_tick_ms(tick_ms)
        deadline = self._deadline(timeout)
        names = self.layout.names(key)
        own = self._process.get().watch.own.get(names.lease)
        token = own.token if own is not None and own.owner == owner and not own.lost else None
        plain = pops.plain_owned(names.lease, owner)
        for _ in range(TRIES):
            if token is None:
                reply = self._txn({"compare": plain, "success": [ops.get(names.lease)]}, deadline)
                record = (
                    self._decoded(ops.kvs(reply["responses"][0]))
                    if reply.get("succeeded")
                    else None
                )
                if record is None:
                    return False
                token = record.token
            value = json.dumps({"tick": tick_ms, "token": token}, separators=(",", ":")).encode()
            body = {
                "compare": [*plain, ops.created_at(names.lease, token)],
                "success": [ops.put(names.tick, value)],
                "failure": [ops.get(names.lease)],
            }
            reply = self._txn(body, deadline)
            if reply.get("succeeded"):
                return True
            found = self._decoded(ops.kvs(reply["responses"][0]))
            if found is None or found.owner != owner or found.token == token:
                return False
            token = None  # the owner's lease has another token than the one compared: read it
        return False

    def recorded_tick(self, key: str, *, timeout: float | None = None) -> TickRecord | None:
        """One range read of the key's tick record."""
        name = self.layout.names(key).tick
        reply = self._txn({"compare": [], "success": [ops.get(name)]}, self._deadline(timeout))
        kv = pops.first_kv(reply["responses"][0])
        if kv is None:
            return None
        body = json.loads(ops.unb64(kv.get("value", "")))
        return TickRecord(int(body["tick"]), int(body["token"]))
