"""How ``EtcdStore`` lists: ranges of the prefix, and each etcd lease's time left."""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from django_locks.stores.etcd import records
from django_locks.stores.etcd import wire as ops
from django_locks.stores.etcd.calls import Calls
from django_locks.stores.etcd.records import Record


class Listing(Calls):
    """Reading many keys, and the etcd leases they are on."""

    def _range(self, prefix: bytes) -> Iterable[Record]:
        deadline = self._deadline(None)
        start = prefix
        while True:
            body = {
                "key": ops.b64(start),
                "range_end": ops.b64(ops.range_end(prefix)),
                "limit": "1000",
            }
            reply = self._process.get().wire.call("kv/range", body, deadline)
            kvs = reply.get("kvs", [])
            for kv in kvs:
                record = records.decode(self.layout, kv)
                if record is not None:
                    yield record
            if not reply.get("more") or not kvs:
                return
            start = ops.unb64(kvs[-1]["key"]) + b"\x00"

    def _time_left(
        self, lease_ids: set[int]
    ) -> dict[int, tuple[datetime.timedelta, datetime.datetime]]:
        """Per etcd lease: its time left, and when it was last kept alive (now less the time
        it has run down from its TTL: a lock's last renewal)."""
        deadline = self._deadline(None)
        left = {}
        for lease_id in lease_ids:
            if lease_id:
                reply = self._process.get().wire.call(
                    "lease/timetolive", {"ID": str(lease_id)}, deadline
                )
                now = datetime.datetime.now(datetime.UTC)
                ttl = max(int(reply.get("TTL", 0)), 0)
                granted = max(int(reply.get("grantedTTL", 0)), ttl)
                # etcd rounds the time left down: the last keepalive was less than a second
                # before now - (granted - ttl) + 1 s, the figure shown (never past now).
                run_down = max(granted - ttl - 1, 0)
                left[lease_id] = (
                    datetime.timedelta(seconds=ttl),
                    now - datetime.timedelta(seconds=run_down),
                )
        return left
