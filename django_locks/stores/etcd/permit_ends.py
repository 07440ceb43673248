"""How ``EtcdStore``'s slots end: released, left to lapse, or freed by an operator; and how the
key's own record follows (``permit_ops.py`` says where it lives)."""

from __future__ import annotations

import math
import time

from django_locks.holders import Holder
from django_locks.stores.base import PERMITS_OWNER, Slot, holder_name
from django_locks.stores.etcd import permit_ops as pops
from django_locks.stores.etcd import records
from django_locks.stores.etcd import wire as ops
from django_locks.stores.etcd.permit_ops import Seen
from django_locks.stores.etcd.renewals import Renewals
from django_locks.stores.etcd.wire import Json, LeaseNotFound

SETTLE_TRIES = 4
"""Attempts to move a key's record onto another slot's lease before leaving it where it is."""


class PermitEnds(Renewals):
    """What ``release``, ``end``, ``leave``, ``force_release`` and renewals' preempted slots do
    with a :class:`Slot` (``permits.py`` builds on it)."""

    def _lease_left(self, lease: int, deadline: float) -> tuple[float, int]:
        """Seconds etcd lease ``lease`` has left at least, and its TTL (0, 0 when gone)."""
        process = self._process.get()
        granted = process.leases.by_id(lease)
        if granted is not None:
            return max(process.leases.left_s(granted), 0.0), granted.ttl_s
        answer = process.wire.call("lease/timetolive", {"ID": str(lease)}, deadline)
        return float(max(int(answer.get("TTL", 0)), 0)), int(answer.get("grantedTTL", 0) or 0)

    # Ending a slot: the record follows.

    def _release_slot(self, slot: Slot, owner: str, deadline: float) -> bool:
        """ONE Txn guarded on the owner: the slot and its preempt request deleted, and the
        key's record with it when no other key of its slot range exists. Else, when the record
        was on this slot's lease and no other slot is, :meth:`_settle` moves it onto the live
        slot's lease that ends latest (a timetolive per other process's lease, and one Txn)."""
        name = self.layout.names(slot).lease
        base = self.layout.names(slot.base).lease
        start, end = pops.slot_range(self.layout, slot.base)
        alone = [pops.none_in(start, name), pops.none_in(name + b"\x00", end)]
        settle = ops.txn([*alone, *pops.is_record(base)], [ops.delete(base)],
                         [ops.get(base), ops.get_prefix(start)])  # fmt: skip
        body = {
            "compare": ops.owned_by(name, records.owner_prefix(owner)),
            "success": [ops.get(name), ops.delete(name),
                        ops.delete(self.layout.names(slot).preempt), settle],
        }  # fmt: skip
        reply = self._txn(body, deadline)
        if not reply.get("succeeded"):
            return False
        self._process.get().watch.drop(name)
        responses = reply["responses"]
        gone = pops.first_kv(responses[0])
        inner = responses[3]["response_txn"]
        if gone is not None and not inner.get("succeeded"):
            kv = pops.first_kv(inner["responses"][0])
            found = pops.seen(self.layout, slot.base, ops.kvs(inner["responses"][1]))
            self._settle(slot.base, int(gone.get("lease", 0)), kv, found, deadline)
        return True

    def _settle(
        self, base: str, left: int, kv: Json | None, found: list[Seen], deadline: float
    ) -> None:
        """After a slot on etcd lease ``left`` ended: the key's record deleted when no slot is
        live, or moved off ``left`` onto the live slot's lease ending latest when it was on
        ``left`` and no live slot is; each Txn guarded on the record as read."""
        name = self.layout.names(base).lease
        start, _ = pops.slot_range(self.layout, base)
        for _ in range(SETTLE_TRIES):
            record = records.decode(self.layout, kv) if kv is not None else None
            if kv is None or record is None or record.owner != PERMITS_OWNER:
                return
            permits = record.permits or 0
            live = [s for s in pops.live_slots(found) if (s.position or 0) <= permits]
            guard = [pops.mod_is(name, int(kv["mod_revision"]))]
            if not live:
                success = [ops.delete(name)]
            elif record.lease != left or any(one.lease == left for one in live):
                return
            else:
                ends = {
                    lease: self._lease_left(lease, deadline) for lease in {s.lease for s in live}
                }
                target = max(live, key=lambda one: (ends[one.lease][0], one.token))
                span = max(ends[target.lease][1], 1)
                since = pops.body_of(kv).get("since", _now_ms())
                value = pops.record_value(permits, span, _holder(), since)
                guard += [ops.created_at(target.name, target.token),
                          ops.on_lease(target.name, target.lease)]  # fmt: skip
                success = [ops.put(name, value, target.lease)]
            body = {"compare": guard, "success": success,
                    "failure": [ops.get(name), ops.get_prefix(start)]}  # fmt: skip
            try:
                reply = self._txn(body, deadline)
            except LeaseNotFound:  # that slot's lease just expired: read again
                reply = self._txn({"compare": [], "success": body["failure"]}, deadline)
                reply["succeeded"] = False
            if reply.get("succeeded"):
                return
            kv = pops.first_kv(reply["responses"][0])
            found = pops.seen(self.layout, base, ops.kvs(reply["responses"][1]))

    def _strand(self, key: str, owner: str, ttl_s: float | None, deadline: float) -> bool:
        """A slot moved onto a lease of its own (``leave``, or a preempted slot left to
        lapse): the slot and the key's record read, a lease granted, then one Txn guarded on
        both moving the slot and, when the record was on the slot's lease (and no other live
        slot is) or ends before the slot's new expiry, the record with it."""
        if not isinstance(key, Slot):
            return super()._strand(key, owner, ttl_s, deadline)
        name = self.layout.names(key).lease
        base = self.layout.names(key.base).lease
        start, _ = pops.slot_range(self.layout, key.base)
        for _ in range(SETTLE_TRIES):
            reply = self._txn({"compare": [], "success": [ops.get(name), ops.get(base),
                               ops.get_prefix(start)]}, deadline)  # fmt: skip
            slot_kv, kv = (pops.first_kv(response) for response in reply["responses"][:2])
            mine = records.decode(self.layout, slot_kv) if slot_kv is not None else None
            if mine is None or mine.owner != owner or mine.permits is None:
                return False
            life = ttl_s if ttl_s is not None else self._strand_ttl(name, deadline)
            own = self._process.get().leases.grant(max(math.ceil(life), 1), deadline)
            compare = [
                *ops.owned_by(name, records.owner_prefix(owner)),
                ops.created_at(name, mine.token),
                ops.on_lease(name, mine.lease),
            ]
            success = [ops.move(name, own.id)]
            record = records.decode(self.layout, kv) if kv is not None else None
            value = pops.record_value(mine.permits, own.ttl_s, _holder(),
                                      pops.body_of(kv).get("since", _now_ms()))  # fmt: skip
            if kv is None:  # the record lapsed while this slot lives: put again
                compare.append(ops.absent(base))
                success.append(ops.put(base, value, own.id))
            elif record is not None and record.owner == PERMITS_OWNER:
                others = pops.live_slots(pops.seen(self.layout, key.base,
                                                   ops.kvs(reply["responses"][2])))  # fmt: skip
                shared = any(o.lease == mine.lease and o.name != name for o in others)
                stays = record.lease != mine.lease or shared
                if not stays or self._lease_left(record.lease, deadline)[0] < own.ttl_s:
                    compare.append(pops.mod_is(base, int(kv["mod_revision"])))
                    success.append(ops.put(base, value, own.id))
            if self._txn({"compare": compare, "success": success}, deadline).get("succeeded"):
                self._process.get().watch.drop(name)
                return True
        return False

    # Operators, preempt requests, listings.

    def _force_release(self, key: str) -> bool:
        """A key's record: deleted with every slot (its permits value's, and any other read),
        in two Txns (a read, then the deletes). A plain lease or a slot: deleted in one Txn
        (a slot's record following as after a release, in one more), and any slot of ``key``
        found live without its record deleted too."""
        deadline = self._deadline(None)
        names = self.layout.names(key)
        start, _ = pops.slot_range(self.layout, key)
        body = {
            "compare": pops.is_record(names.lease),
            "success": [ops.get(names.lease), ops.get_prefix(start)],
            "failure": [ops.get(names.lease), ops.delete(names.lease), ops.delete(names.preempt),
                        ops.get_prefix(start)],
        }  # fmt: skip
        reply = self._txn(body, deadline)
        responses = reply["responses"]
        found = pops.live_slots(pops.seen(self.layout, key, ops.kvs(responses[-1])))
        doomed = {one.name for one in found}
        if reply.get("succeeded"):
            record = self._decoded(ops.kvs(responses[0]))
            permits = record.permits if record is not None else None
            doomed |= {pops.slot_name(self.layout, key, n) for n in range(1, (permits or 0) + 1)}
            self._delete(sorted(doomed), [names.lease, names.preempt], deadline)
            return True
        was = pops.first_kv(responses[0])
        if doomed:
            self._delete(sorted(doomed), [], deadline)
        gone = records.decode(self.layout, was) if was is not None else None
        if gone is not None and gone.base is not None:
            self._settle_after(gone.base, gone.lease, deadline)
        return was is not None or bool(doomed)

    def _settle_after(self, base: str, left: int, deadline: float) -> None:
        """:meth:`_settle` after a slot was deleted without its key's record in view."""
        name = self.layout.names(base).lease
        start, end = pops.slot_range(self.layout, base)
        reads = [ops.get(name), ops.get_prefix(start)]
        body = {"compare": [pops.none_in(start, end), *pops.is_record(name)],
                "success": [ops.delete(name)], "failure": reads}  # fmt: skip
        reply = self._txn(body, deadline)
        if not reply.get("succeeded"):
            found = pops.seen(self.layout, base, ops.kvs(reply["responses"][1]))
            self._settle(base, left, pops.first_kv(reply["responses"][0]), found, deadline)

    def _delete(self, slots: list[bytes], also: list[bytes], deadline: float) -> None:
        """Delete ``also``, and each of ``slots`` with its preempt request (nested Txns of 50
        slots: within --max-txn-ops)."""
        nested = []
        for begin in range(0, len(slots), 50):
            deletes = []
            for name in slots[begin : begin + 50]:
                slot_key = self.layout.key_of(name)
                assert slot_key is not None
                deletes += [ops.delete(name), ops.delete(self.layout.names(slot_key).preempt)]
            nested.append(ops.txn([], deletes))
        success = [ops.delete(name) for name in also] + nested
        self._txn({"compare": [], "success": success}, deadline)
        for name in slots:
            self._process.get().watch.drop(name)


def _holder() -> Holder:
    return Holder.parse(holder_name())


def _now_ms() -> int:
    return int(time.time() * 1000)
