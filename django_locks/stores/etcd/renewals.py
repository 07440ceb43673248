"""How ``EtcdStore`` renews: one keepalive per shared lease for every key on it, and per-key
answers from the process's watch (``watch.py``), read from the keys themselves where it cannot
vouch for them."""

from __future__ import annotations

import math
import time

from django_locks.holders import Holder
from django_locks.policy import POLICY
from django_locks.stores.base import PREEMPTED, Renewed, Slot, holder_name
from django_locks.stores.etcd import permit_ops, records
from django_locks.stores.etcd import wire as ops
from django_locks.stores.etcd.calls import Calls
from django_locks.stores.etcd.leases import Granted
from django_locks.stores.etcd.records import Record
from django_locks.stores.etcd.wire import Json

BATCH = 100
"""Keys checked per Txn when renewals read them (etcd's --max-txn-ops is 128 by default)."""
GUARDS = 3
"""Slots of one key, per renewal, whose ownership may carry the key's record along (a chain of
nested Txns: any one of them live puts it on the renewed lease)."""

Followed = tuple[Slot, str, int, int | None]
"""A slot renewed onto a lease: the slot, its owner, its key's permits, the lease it left."""


class Renewals(Calls):
    """``renew_many``'s two round trips, and leaving a key to lapse on a lease of its own."""

    def _renew_group(
        self, items: list[tuple[str, str]], granted: Granted, deadline: float
    ) -> list[Renewed]:
        process = self._process.get()
        watch = process.watch
        names = [self.layout.names(key).lease for key, _ in items]
        answers: list[Renewed | None] = [None] * len(items)
        fast = []
        followed: list[Followed] = []  # slots whose key's record goes onto this lease
        for index, name in enumerate(names):
            key, owner = items[index]
            own = watch.own.get(name)
            if own is None or own.owner != owner or not watch.covered(own):
                continue
            if own.lease != granted.id:
                continue
            if isinstance(key, Slot):
                if own.permits is None:
                    continue  # read, to learn its key's permits value
                followed.append((key, owner, own.permits, None))
            fast.append(index)
        if fast:
            watch.ensure()  # a watch thread that died is started again (it resumes: no gap)
            # The heartbeat, and each renewed slot's key's record moved onto this lease where
            # permit_ops.record_chain says (guarded on the slot: never for a slot lost).
            heartbeat = ops.put(self.layout.heartbeat(process.id), b"", granted.id)
            success = [heartbeat, *self._record_ops(followed, granted)]
            reply = self._txn({"compare": [], "success": success}, deadline, again=True)
            followed = []
            revision = int(reply["header"]["revision"])
            if watch.through(revision, min(POLICY.etcd_heartbeat_wait, self._left(deadline))):
                for index in fast:
                    own = watch.own.get(names[index])
                    if own is None or own.lost or own.owner != items[index][1]:
                        answers[index] = False
                    elif own.preempted:
                        answers[index] = PREEMPTED
                    elif own.lease == granted.id:
                        answers[index] = True
        slow = [index for index, answer in enumerate(answers) if answer is None]
        for start in range(0, len(slow), BATCH):
            chunk = slow[start : start + BATCH]
            for index, answer in zip(
                chunk, self._read_renew(items, chunk, granted, deadline, followed), strict=True
            ):
                answers[index] = answer
        if followed:  # slots read (and moved): their keys' records, before the keepalive
            self._txn(
                {"compare": [], "success": self._record_ops(followed, granted)},
                deadline,
                again=True,
            )
        preempted = [index for index, answer in enumerate(answers) if answer == PREEMPTED]
        for index in preempted:
            key, owner = items[index]
            self._strand(key, owner, None, deadline)
        renewing = any(answer is True for answer in answers)
        if renewing and not process.leases.keepalive(granted, deadline):
            return [False] * len(items)
        return [answer if answer is not None else False for answer in answers]

    def _read_renew(
        self,
        items: list[tuple[str, str]],
        chunk: list[int],
        granted: Granted,
        deadline: float,
        followed: list[Followed],
    ) -> list[Renewed]:
        """One Txn for ``chunk``: per key, the owner checked and the key and its preempt request
        read; keys found on another lease (and not preempted) are moved onto ``granted`` in one
        more Txn, guarded on their owners. Slots renewed are added to ``followed``."""
        nested = []
        for index in chunk:
            key, owner = items[index]
            names = self.layout.names(key)
            owned = ops.owned_by(names.lease, records.owner_prefix(owner))
            nested.append(ops.txn(owned, [ops.get(names.lease), ops.get(names.preempt)]))
        reply = self._txn({"compare": [], "success": nested}, deadline, again=True)
        revision = int(reply["header"]["revision"])
        process = self._process.get()
        answers: list[Renewed] = []
        moves: list[tuple[int, Record]] = []
        for response in reply["responses"]:
            inner = response["response_txn"]
            record = (
                self._decoded(ops.kvs(inner["responses"][0])) if inner.get("succeeded") else None
            )
            if record is None:
                answers.append(False)
                continue
            if names_token(ops.kvs(inner["responses"][1]), record.token):
                answers.append(PREEMPTED)
                continue
            answers.append(True)
            key = items[chunk[len(answers) - 1]][0]
            if isinstance(key, Slot) and record.permits is not None:
                left = record.lease if record.lease != granted.id else None
                followed.append((key, record.owner, record.permits, left))
            if record.lease != granted.id:
                moves.append((len(answers) - 1, record))
            else:
                name = self.layout.names(record.key).lease
                process.watch.hold(
                    name, record.owner, record.token, granted.id, revision, permits=_slot(record)
                )
        if moves:
            nested = []
            for _, record in moves:
                name = self.layout.names(record.key).lease
                owned = ops.owned_by(name, records.owner_prefix(record.owner))
                nested.append(ops.txn(owned, [ops.move(name, granted.id)]))
            reply = self._txn({"compare": [], "success": nested}, deadline, again=True)
            revision = int(reply["header"]["revision"])
            for (position, record), response in zip(moves, reply["responses"], strict=True):
                moved = bool(response["response_txn"].get("succeeded"))
                answers[position] = moved
                if moved:
                    name = self.layout.names(record.key).lease
                    process.watch.hold(
                        name,
                        record.owner,
                        record.token,
                        granted.id,
                        revision,
                        permits=_slot(record),
                    )
        return answers

    def _record_ops(self, followed: list[Followed], granted: Granted) -> list[Json]:
        """Per key of ``followed``: one nested Txn putting its record onto ``granted`` as
        ``permit_ops.record_chain`` says, guarded on the first of its slots (up to ``GUARDS``)
        found live on ``granted``; in Txns of 50 keys (within --max-txn-ops)."""
        by_base: dict[str, list[Followed]] = {}
        for entry in followed:
            by_base.setdefault(entry[0].base, []).append(entry)
        holder, now_ms = Holder.parse(holder_name()), int(time.time() * 1000)
        chains = []
        for base, group in by_base.items():
            record = self.layout.names(base).lease
            node: Json | None = None
            for slot, owner, permits, left in reversed(group[:GUARDS]):
                name = self.layout.names(slot).lease
                guard = [*ops.owned_by(name, records.owner_prefix(owner)),
                         ops.on_lease(name, granted.id)]  # fmt: skip
                chain = permit_ops.record_chain(
                    record, permits, granted.id, granted.ttl_s, holder, now_ms, follow=left
                )
                node = ops.txn(guard, [chain], [node] if node else [])
            assert node is not None
            chains.append(node)
        return [ops.txn([], chains[start : start + 50]) for start in range(0, len(chains), 50)]

    def _strand(self, key: str, owner: str, ttl_s: float | None, deadline: float) -> bool:
        """Move ``key`` onto a lease of its own of ``ttl_s`` (rounded up; the cluster's minimum
        at least) that nobody renews, in one Txn guarded on its owner. ``ttl_s`` ``None``: the
        time its lease has left, at least until the holder's deadline (which counts from a
        renewal sent before this process's last keepalive of that lease)."""
        process = self._process.get()
        names = self.layout.names(key)
        if ttl_s is None:
            ttl_s = self._strand_ttl(names.lease, deadline)
        own_lease = process.leases.grant(max(math.ceil(ttl_s), 1), deadline)
        owned = ops.owned_by(names.lease, records.owner_prefix(owner))
        body = {"compare": owned, "success": [ops.move(names.lease, own_lease.id)]}
        reply = self._txn(body, deadline, again=True)
        if reply.get("succeeded"):
            process.watch.drop(names.lease)
        return bool(reply.get("succeeded"))

    def _strand_ttl(self, name: bytes, deadline: float) -> float:
        """The time the lease of the key ``name`` has left, at least until the holder's
        deadline (which counts from a renewal sent before this process's last keepalive)."""
        process = self._process.get()
        own = process.watch.own.get(name)
        granted = None if own is None else process.leases.by_id(own.lease)
        if granted is not None:
            return process.leases.left_s(granted)
        return self._left_on(name, deadline) + 1  # etcd says whole seconds left, rounded down

    def _left_on(self, name: bytes, deadline: float) -> float:
        """Seconds the etcd lease of the key ``name`` has left (0 when it has none)."""
        reply = self._txn({"compare": [], "success": [ops.get(name)]}, deadline, again=True)
        found = ops.kvs(reply["responses"][0])
        lease = int(found[0].get("lease", 0)) if found else 0
        if not lease:
            return 0.0
        answer = self._process.get().wire.call(
            "lease/timetolive", {"ID": str(lease)}, deadline, again=True
        )
        return float(max(int(answer.get("TTL", 0)), 0))


def names_token(request: list[Json], token: int) -> bool:
    """Whether the preempt request read (a range's key-values) names ``token``."""
    return bool(request) and ops.unb64(request[0].get("value", "")) == str(token).encode()


def _slot(record: Record) -> int | None:
    """A slot's permits value (what the watch keeps for its renewals), ``None`` for a lease."""
    return record.permits if record.base is not None else None
