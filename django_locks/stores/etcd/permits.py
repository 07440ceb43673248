"""``EtcdStore``'s permits: a key's slots ``l/K#<n>`` and its own record ``l/K``
(``permit_ops.py`` says what they hold and where the record lives).

"Never more than ``permits`` slots live" needs no more than etcd's own guarantee: a slot is
created only by a Txn comparing its key absent (``create_revision == 0``), and only the keys
``K#1`` to ``K#permits`` are slots, so at most ``permits`` of them exist at any revision. A slot's
token is its key's ``create_revision``: a revision of the whole cluster, so greater than every
token the key, its record or any slot ever had.
"""

from __future__ import annotations

import dataclasses
import datetime
import time

from django_locks.exceptions import PermitsMismatchError
from django_locks.holders import Holder
from django_locks.stores.base import PERMITS_OWNER, PermitGrant, holder_name
from django_locks.stores.etcd import permit_ops as pops
from django_locks.stores.etcd import records
from django_locks.stores.etcd import wire as ops
from django_locks.stores.etcd.leases import Granted
from django_locks.stores.etcd.permit_ends import PermitEnds
from django_locks.stores.etcd.permit_ops import Seen
from django_locks.stores.etcd.records import Record
from django_locks.stores.etcd.wire import Json, LeaseNotFound

LOST_RACES = 12
"""Races one call may lose (each lost to another caller's grant or idempotent re-put, or to a
renewal moving a slot) before it answers ``None``, as an acquire that lost does. With 32 threads
racing for 3 permits held 5 to 25 ms each (a one-member etcd on the loaded 2-core machine, Txns
of 30 to 67 ms p50), a call took 1 to 23 Txns; without a bound, in the same race of 2 processes
on the suite's cluster (tests/stores/test_etcd_permits.py) the losers of long streaks ran into
their 5 s timeout (``StoreTimeoutError``)."""

Read = tuple[Json | None, list[Seen], int]
"""A key's record (its key-value, or None), what its slot range holds, and the revision read."""


@dataclasses.dataclass
class _Step:
    """What one ``acquire_permit`` writes."""

    key: str
    owner: str
    permits: int
    holder: Holder
    since: int
    deadline: float
    ttl_ms: int = 0


class Permits(PermitEnds):
    """``acquire_permit``, preempt requests and listings of keys held by permits."""

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
        """A read, then a Txn guarded on it, and another for each race lost (its failure branch
        is the next read); ONE Txn for the first slot of a key with none live.

        Why not one Txn always: etcd's Txn has no loop nor arithmetic, so "the lowest free slot,
        unless this owner holds one" is a chain of nested Txns one slot deep each, and a path
        of nested Txns may hold at most --max-txn-ops (128) operations in all, too few for 1,000
        permits. So the first Txn takes ``K#1`` when the key has no record and no slot (one
        round trip) and otherwise answers the record and the slot range (a read, in the same
        round trip). From that read: ``PermitsMismatchError`` (nothing written), the owner's own
        slot re-put (the same token), the holder of the slot ending first when all are live, or
        the slot ``n`` lowest free at the read taken by a Txn comparing ``K#n`` absent, no slot
        key written since the read (so this owner took none meanwhile) and the record as read;
        the key's record is put or moved in the same Txn. Every lost race costs one more round
        trip (some other caller's write won it); after ``LOST_RACES`` of them: ``None``.
        """
        since = time.monotonic()
        deadline = self._deadline(timeout)
        name = self.layout.names(key).lease
        start, _ = pops.slot_range(self.layout, key)
        step = _Step(key, owner, permits, holder, _now_ms(), deadline)
        step.ttl_ms = self._process.get().leases.effective_ms(ttl_ms)
        read: Read | None = None
        granted = self._shared(ttl_ms, deadline)
        for _ in range(LOST_RACES + 2):  # the first Txn (a read), and LOST_RACES + 1 tries
            own: Seen | None = None
            if read is None:
                permit, body = 1, self._fresh(step, granted)
            else:
                plan = self._plan(key, owner, permits, read[0], read[1])
                if isinstance(plan, list):
                    return self._first_ending(plan, deadline)
                if isinstance(plan, Seen):
                    own, permit = plan, _permit(plan)
                    body = self._again(step, own, granted)
                else:
                    permit, body = plan, self._take(step, plan, read, granted)
            body["failure"] = [ops.get(name), ops.get_prefix(start)]  # the next read
            try:
                reply = self._txn(body, deadline)
            except LeaseNotFound:  # the shared lease expired: another, and the same step again
                self._process.get().leases.forget(granted)
                granted = self._shared(ttl_ms, deadline)
                continue
            revision = int(reply["header"]["revision"])
            responses = reply["responses"]
            if not reply.get("succeeded"):
                found = pops.seen(self.layout, key, ops.kvs(responses[1]))
                read = (pops.first_kv(responses[0]), found, revision)
                continue
            token = own.token if own is not None else revision
            preempted = own is not None and _names(responses[1], token)
            # Kept alive after the Txn unless it was shortly before (``_outlives``).
            lag = self._outlives(granted, since, deadline)
            if lag is None:
                return None
            self._process.get().watch.hold(
                pops.slot_name(self.layout, key, permit),
                owner,
                token,
                granted.id,
                revision,
                preempted=preempted,
                permits=permits,
                lag=lag,
            )
            return PermitGrant(token, permit)
        if read is not None:  # lost every race: full by now, or other callers were quicker
            plan = self._plan(key, owner, permits, read[0], read[1])
            if isinstance(plan, list):
                return self._first_ending(plan, deadline)
        return None

    def _slot_put(self, step: _Step, permit: int, since: int, granted: Granted) -> Json:
        value = pops.slot_value(
            step.owner, step.holder, step.ttl_ms, since, step.key, permit, step.permits
        )
        return ops.put(pops.slot_name(self.layout, step.key, permit), value, granted.id)

    def _fresh(self, step: _Step, granted: Granted) -> Json:
        """``K#1`` and the record, when the key has no record and no key in its slot range."""
        name = self.layout.names(step.key).lease
        start, end = pops.slot_range(self.layout, step.key)
        record = pops.record_value(step.permits, granted.ttl_s, step.holder, step.since)
        return {
            "compare": [ops.absent(name), pops.none_in(start, end)],
            "success": [
                self._slot_put(step, 1, step.since, granted),
                ops.delete(self.layout.names(f"{step.key}#1").preempt),
                ops.put(name, record, granted.id),
            ],
        }

    def _again(self, step: _Step, own: Seen, granted: Granted) -> Json:
        """The owner's own slot re-put onto ``granted`` (its token kept), its preempt request
        read, the record following (``record_chain``)."""
        assert own.record is not None and own.position is not None
        slot = own.name
        name = self.layout.names(step.key).lease
        follow = own.lease if own.lease != granted.id else None
        chain = pops.record_chain(
            name, step.permits, granted.id, granted.ttl_s, step.holder, step.since, follow=follow
        )
        kept = own.record.body.get("since", step.since)
        return {
            "compare": [
                *ops.owned_by(slot, records.owner_prefix(step.owner)),
                ops.created_at(slot, own.token),
            ],
            "success": [
                self._slot_put(step, own.position, kept, granted),
                ops.get(self.layout.names(f"{step.key}#{own.position}").preempt),
                chain,
            ],
        }

    def _take(self, step: _Step, permit: int, read: Read, granted: Granted) -> Json:
        """Slot ``permit`` taken, guarded on the read: it absent, no key of the slot range
        written since, the record as read (or absent: put)."""
        kv, _, revision = read
        name = self.layout.names(step.key).lease
        start, end = pops.slot_range(self.layout, step.key)
        slot = pops.slot_name(self.layout, step.key, permit)
        compare = [ops.absent(slot), pops.unchanged_since(start, end, revision)]
        success = [
            self._slot_put(step, permit, step.since, granted),
            ops.delete(self.layout.names(f"{step.key}#{permit}").preempt),
        ]
        if kv is None:
            record = pops.record_value(step.permits, granted.ttl_s, step.holder, step.since)
            compare.append(ops.absent(name))
            success.append(ops.put(name, record, granted.id))
        else:
            compare += pops.is_record(name, step.permits)
            kept = pops.body_of(kv).get("since", step.since)
            span = granted.ttl_s
            chain = pops.record_chain(
                name, step.permits, granted.id, span, step.holder, kept, repair=False
            )
            success.append(chain)
        return {"compare": compare, "success": success}

    def _plan(
        self, key: str, owner: str, permits: int, kv: Json | None, found: list[Seen]
    ) -> Seen | int | list[Seen]:
        """From a read: the owner's own slot, the lowest free permit, or (all taken) the live
        slots; ``PermitsMismatchError`` when the key's live leases use another permits value."""
        if kv is not None:
            record = records.decode(self.layout, kv)
            if record is None or record.owner != PERMITS_OWNER or record.base is not None:
                raise PermitsMismatchError(key, permits, 1)  # a plain lease, or a slot's key
            if record.permits != permits:
                raise PermitsMismatchError(key, permits, record.permits or 1)
        live = pops.live_slots(found)
        for one in live:
            assert one.record is not None
            if one.record.permits != permits:  # slots whose record lapsed: they still count
                raise PermitsMismatchError(key, permits, one.record.permits or 1)
        for one in live:
            assert one.record is not None
            if one.record.owner == owner and one.position is not None:
                return one
        taken = {one.position for one in found}
        free = next((n for n in range(1, permits + 1) if n not in taken), None)
        return free if free is not None else live

    def _first_ending(self, live: list[Seen], deadline: float) -> Holder | None:
        """The holder of the live slot whose etcd lease ends first: this process's leases'
        expiry known here, one ``lease/timetolive`` per other lease."""
        left = {lease: self._lease_left(lease, deadline)[0] for lease in {s.lease for s in live}}
        if not live:
            return None
        first = min(live, key=lambda one: (left[one.lease], one.token))
        assert first.record is not None
        now = datetime.datetime.now(datetime.UTC)
        return first.record.holder(now + datetime.timedelta(seconds=left[first.lease]))

    # Preempt requests, listings.

    def _preempt_slots(self, key: str, deadline: float) -> int | None:
        """A key held by permits: the request on its live slot with the lowest token, naming
        it, in a Txn guarded on that token (a read first; read again when it ended)."""
        start, _ = pops.slot_range(self.layout, key)
        while True:
            reply = self._txn({"compare": [], "success": [ops.get_prefix(start)]}, deadline)
            live = pops.live_slots(pops.seen(self.layout, key, ops.kvs(reply["responses"][0])))
            if not live:
                return None
            oldest = min(live, key=lambda one: one.token)
            slot_key = self.layout.key_of(oldest.name)
            assert slot_key is not None
            body = {
                "compare": [ops.created_at(oldest.name, oldest.token)],
                "success": [ops.put(self.layout.names(slot_key).preempt,
                                    str(oldest.token).encode())],
            }  # fmt: skip
            if self._txn(body, deadline).get("succeeded"):
                return oldest.token

    def _summary(self, record: Record, deadline: float) -> Record:
        """A key's record as listed: its token the highest of its live slots' (one read)."""
        start, _ = pops.slot_range(self.layout, record.key)
        reply = self._txn({"compare": [], "success": [ops.get_prefix(start)]}, deadline)
        found = pops.live_slots(pops.seen(self.layout, record.key, ops.kvs(reply["responses"][0])))
        return dataclasses.replace(record, token=max([record.token, *(s.token for s in found)]))

    @staticmethod
    def _summaries(found: list[Record]) -> list[Record]:
        """:meth:`_summary` of every record in a listing that also lists their slots."""
        highest: dict[str, int] = {}
        for record in found:
            if record.base is not None:
                highest[record.base] = max(highest.get(record.base, 0), record.token)
        return [
            dataclasses.replace(record, token=max(record.token, highest.get(record.key, 0)))
            if record.owner == PERMITS_OWNER and record.base is None
            else record
            for record in found
        ]


def _permit(plan: Seen | int) -> int:
    if isinstance(plan, Seen):
        assert plan.position is not None
        return plan.position
    return plan


def _names(response: Json, token: int) -> bool:
    found = ops.kvs(response)
    return bool(found) and ops.unb64(found[0].get("value", "")) == str(token).encode()


def _holder() -> Holder:
    return Holder.parse(holder_name())


def _now_ms() -> int:
    return int(time.time() * 1000)
