"""How ``EtcdStore`` renews: one keepalive per shared lease for every key on it, and per-key
answers from the process's watch (``watch.py``), read from the keys themselves where it cannot
vouch for them."""

from __future__ import annotations

import math

from django_locks.policy import POLICY
from django_locks.stores.base import PREEMPTED, Renewed, Slot
from django_locks.stores.etcd import records
from django_locks.stores.etcd import wire as ops
from django_locks.stores.etcd.calls import Calls
from django_locks.stores.etcd.leases import Granted
from django_locks.stores.etcd.records import Record
from django_locks.stores.etcd.wire import Json

BATCH = 100
"""Keys checked per Txn when renewals read them (etcd's --max-txn-ops is 128 by default)."""


class Renewals(Calls):
    """``renew_many``'s two round trips, and leaving a key to lapse on a lease of its own."""

    def _renew_group(
        self, items: list[tuple[str, str]], granted: Granted, deadline: float
    ) -> list[Renewed]:
        process = self._process.get()
        watch = process.watch
        names = [self.layout.names(key).lease for key, _ in items]
        answers: list[Renewed | None] = [None] * len(items)
        fast = [
            index
            for index, name in enumerate(names)
            if not isinstance(items[index][0], Slot)
            and (own := watch.own.get(name)) is not None
            and own.owner == items[index][1]
            and watch.covered(own)
            and own.lease == granted.id
        ]
        if fast:
            watch.ensure()  # a watch thread that died is started again (it resumes: no gap)
            reply = self._txn(
                {
                    "compare": [],
                    "success": [ops.put(self.layout.heartbeat(process.id), b"", granted.id)],
                },
                deadline,
            )
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
                chunk, self._read_renew(items, chunk, granted, deadline), strict=True
            ):
                answers[index] = answer
        preempted = [index for index, answer in enumerate(answers) if answer == PREEMPTED]
        for index in preempted:
            key, owner = items[index]
            self._strand(key, owner, None, deadline)
        renewing = any(answer is True for answer in answers)
        if renewing and not process.leases.keepalive(granted, deadline):
            return [False] * len(items)
        return [answer if answer is not None else False for answer in answers]

    def _read_renew(
        self, items: list[tuple[str, str]], chunk: list[int], granted: Granted, deadline: float
    ) -> list[Renewed]:
        """One Txn for ``chunk``: per key, the owner checked and the key and its preempt request
        read; keys found on another lease (and not preempted) are moved onto ``granted`` in one
        more Txn, guarded on their owners."""
        nested = []
        for index in chunk:
            key, owner = items[index]
            names = self.layout.names(key)
            owned = ops.owned_by(names.lease, records.owner_prefix(owner))
            nested.append(ops.txn(owned, [ops.get(names.lease), ops.get(names.preempt)]))
        reply = self._txn({"compare": [], "success": nested}, deadline)
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
            if record.lease != granted.id:
                moves.append((len(answers) - 1, record))
            else:
                name = self.layout.names(record.key).lease
                process.watch.hold(name, record.owner, record.token, granted.id, revision)
        if moves:
            nested = []
            for _, record in moves:
                name = self.layout.names(record.key).lease
                owned = ops.owned_by(name, records.owner_prefix(record.owner))
                nested.append(ops.txn(owned, [ops.move(name, granted.id)]))
            reply = self._txn({"compare": [], "success": nested}, deadline)
            revision = int(reply["header"]["revision"])
            for (position, record), response in zip(moves, reply["responses"], strict=True):
                moved = bool(response["response_txn"].get("succeeded"))
                answers[position] = moved
                if moved:
                    name = self.layout.names(record.key).lease
                    process.watch.hold(name, record.owner, record.token, granted.id, revision)
        return answers

    def _strand(self, key: str, owner: str, ttl_s: float | None, deadline: float) -> bool:
        """Move ``key`` onto a lease of its own of ``ttl_s`` (rounded up; the cluster's minimum
        at least) that nobody renews, in one Txn guarded on its owner. ``ttl_s`` ``None``: the
        time its lease has left, at least until the holder's deadline (which counts from a
        renewal sent before this process's last keepalive of that lease)."""
        process = self._process.get()
        names = self.layout.names(key)
        if ttl_s is None:
            own = process.watch.own.get(names.lease)
            granted = None if own is None else process.leases.by_id(own.lease)
            if granted is not None:
                ttl_s = process.leases.left_s(granted)
            else:  # etcd reports whole seconds left, rounded down: one more
                ttl_s = self._left_on(names.lease, deadline) + 1
        own_lease = process.leases.grant(max(math.ceil(ttl_s), 1), deadline)
        owned = ops.owned_by(names.lease, records.owner_prefix(owner))
        body = {"compare": owned, "success": [ops.move(names.lease, own_lease.id)]}
        reply = self._txn(body, deadline)
        if reply.get("succeeded"):
            process.watch.drop(names.lease)
        return bool(reply.get("succeeded"))

    def _left_on(self, name: bytes, deadline: float) -> float:
        """Seconds the etcd lease of the key ``name`` has left (0 when it has none)."""
        reply = self._txn({"compare": [], "success": [ops.get(name)]}, deadline)
        found = ops.kvs(reply["responses"][0])
        lease = int(found[0].get("lease", 0)) if found else 0
        if not lease:
            return 0.0
        answer = self._process.get().wire.call("lease/timetolive", {"ID": str(lease)}, deadline)
        return float(max(int(answer.get("TTL", 0)), 0))


def names_token(request: list[Json], token: int) -> bool:
    """Whether the preempt request read (a range's key-values) names ``token``."""
    return bool(request) and ops.unb64(request[0].get("value", "")) == str(token).encode()
