"""What ``EtcdStore``'s permits write and compare: the values of a slot and of its key's own
record, the Txn comparisons on them, and the nested Txn that keeps the record on a live slot's
etcd lease (``permits.py`` and ``renewals.py`` build their Txns from these).

A slot of ``K`` is the lease key ``l/K#<n>``; its value is ``<owner> NUL {"base":K,"permit":n,
"permits":N,"host":...}`` (``base`` first: a plain lease's JSON starts with ``"host"``, which is how
``record_tick`` tells a plain lease from a slot in a comparison). The key's own record is
``l/K`` itself, valued ``permits NUL {"permits":N,"span":"<12 digits>",...}``: ``span`` is the
TTL in seconds of the etcd lease the record is on, zero-padded so that a comparison of the whole
value (etcd compares values only whole, bytewise) can tell whether that TTL is at most some
figure (:func:`span_at_most`).

Where the record lives: on the etcd lease of one of the key's live slots (so it never outlives
them: etcd deletes a lease's keys as it expires), moved onto the lease of each slot acquired or
renewed whose lease's TTL is no shorter than the record's (:func:`record_chain`): after a
keepalive, such a lease ends no sooner than the record's could. With one ttl for every slot of a
key (one call site) the record is thus always on the lease kept alive last: it ends with the
latest of them. A slot moved off its lease (a renewal with another ttl, ``leave``, a preempted
slot left to lapse) takes the record along when it was on that lease; a slot released takes it
to another live slot's lease, the one ending latest, or deletes it with the last slot.

What this does not cover: with slots of two ttls, the record stays on the longer lease; when that
lease's process dies, the record ends with its slot while the shorter slot lives on, until that
slot's next renewal puts the record back (a renewal writes it when missing): 0.146 s measured
with renewals every 0.5 s (tests/stores/test_etcd_permits.py). Meanwhile a plain ``acquire`` of
the key would take it (``acquire_permit`` reads the slots themselves, and still refuses another
permits value). With one ttl per key, the renewal of each live slot moves the record before the
lease it is on can end, so the key is never without it while a slot's holder still renews.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from django_locks.holders import Holder
from django_locks.keys import MAX_PERMITS
from django_locks.stores.base import PERMITS_OWNER
from django_locks.stores.etcd import records
from django_locks.stores.etcd import wire as ops
from django_locks.stores.etcd.records import Layout, Record
from django_locks.stores.etcd.wire import Json, b64

_RECORD = PERMITS_OWNER.encode() + records.SEP
_ANY_RECORD = _RECORD + b'{"permits":'  # every record's value starts so
SPAN_DIGITS = 12  # etcd's longest lease is 9,000,000,000 s: 10 digits


def slot_value(
    owner: str,
    holder: Holder,
    ttl_ms: int,
    since_ms: int,
    base: str,
    permit: int,
    permits: int,
) -> bytes:
    body = {"base": base, "permit": permit, "permits": permits, "host": holder.host,
            "pid": holder.pid, "kind": holder.kind, "detail": holder.detail, "since": since_ms,
            "ttl": ttl_ms}  # fmt: skip
    return records.owner_prefix(owner) + json.dumps(body, separators=(",", ":")).encode()


def record_prefix(permits: int) -> bytes:
    return _ANY_RECORD + b'%d,"span":"' % permits


def record_value(permits: int, span_s: int, holder: Holder, since_ms: int) -> bytes:
    """The key's own record on an etcd lease of ``span_s`` seconds (``holder``: who wrote it)."""
    body = json.dumps(
        {"host": holder.host, "pid": holder.pid, "kind": "process", "detail": "",
         "since": since_ms, "ttl": span_s * 1000},
        separators=(",", ":"),
    )  # fmt: skip
    return record_prefix(permits) + b"%0*d" % (SPAN_DIGITS, span_s) + b'",' + body[1:].encode()


# Comparisons (etcdserverpb.Compare as the gateway's JSON spells them).


def _value(key: bytes, value: bytes, result: str) -> Json:
    return {"target": "VALUE", "key": b64(key), "value": b64(value), "result": result}


def value_from(key: bytes, low: bytes, high: bytes) -> list[Json]:
    """The key's value is above ``low`` and below ``high`` (false when the key is absent)."""
    return [_value(key, low, "GREATER"), _value(key, high, "LESS")]


def is_record(name: bytes, permits: int | None = None) -> list[Json]:
    """``name`` holds a key's own record (of ``permits``, when given)."""
    if permits is None:
        return value_from(name, _ANY_RECORD, _RECORD + b'{"permits";')
    return value_from(name, record_prefix(permits), record_prefix(permits) + b":")


def span_at_most(name: bytes, permits: int, span_s: int) -> list[Json]:
    """``name`` holds the record of ``permits`` on a lease of ``span_s`` seconds or less."""
    prefix = record_prefix(permits)
    return value_from(name, prefix, prefix + b"%0*d" % (SPAN_DIGITS, span_s + 1))


def span_equal(name: bytes, permits: int, span_s: int) -> list[Json]:
    prefix = record_prefix(permits) + b"%0*d" % (SPAN_DIGITS, span_s)
    return value_from(name, prefix, prefix + b"#")  # the digits are followed by '"'


def plain_owned(name: bytes, owner: str) -> list[Json]:
    """``name`` is ``owner``'s plain lease: not a slot (``{"base"``) nor a record."""
    prefix = records.owner_prefix(owner) + b'{"host":'
    return value_from(name, prefix, prefix[:-1] + b";")


def none_in(start: bytes, end: bytes) -> Json:
    """No key in ``[start, end)``."""
    return {"target": "CREATE", "key": b64(start), "range_end": b64(end),
            "create_revision": "0", "result": "EQUAL"}  # fmt: skip


def unchanged_since(start: bytes, end: bytes, revision: int) -> Json:
    """No key in ``[start, end)`` was created or written after ``revision`` (deletions pass)."""
    return {"target": "MOD", "key": b64(start), "range_end": b64(end),
            "mod_revision": str(revision + 1), "result": "LESS"}  # fmt: skip


def mod_is(name: bytes, revision: int) -> Json:
    return {"target": "MOD", "key": b64(name), "mod_revision": str(revision), "result": "EQUAL"}


def record_chain(
    name: bytes,
    permits: int,
    lease: int,
    span_s: int,
    holder: Holder,
    since_ms: int,
    *,
    follow: int | None = None,
    repair: bool = True,
) -> Json:
    """One nested Txn putting the record ``name`` onto ``lease`` (of ``span_s`` seconds) when it
    is on ``follow`` (the lease a slot leaves), when its lease's TTL is no longer than
    ``span_s`` (kept as it is, but for the lease, when the same), or (``repair``) when it is
    missing; else nothing. One chain per record and Txn: etcd refuses two puts of one key."""
    put = ops.put(name, record_value(permits, span_s, holder, since_ms), lease)
    chain = ops.txn([ops.absent(name)], [put]) if repair else None
    chain = ops.txn(span_at_most(name, permits, span_s - 1), [put], [chain] if chain else [])
    chain = ops.txn(span_equal(name, permits, span_s), [ops.move(name, lease)], [chain])
    if follow is not None:
        chain = ops.txn([ops.on_lease(name, follow), *is_record(name, permits)], [put], [chain])
    return chain


# What a read of a key's slot range found.


@dataclasses.dataclass(frozen=True)
class Seen:
    """One key of ``l/K#...`` as read: ``record`` set when it is a slot of ``K``."""

    position: int | None  # n when named ``K#n`` (1 to MAX_PERMITS), else None
    name: bytes
    token: int
    mod: int
    lease: int
    record: Record | None


def slot_range(layout: Layout, base: str) -> tuple[bytes, bytes]:
    prefix = layout.names(base).lease + b"#"
    return prefix, ops.range_end(prefix)


def slot_name(layout: Layout, base: str, permit: int) -> bytes:
    return layout.names(base).lease + b"#%d" % permit


def seen(layout: Layout, base: str, kvs: list[Json]) -> list[Seen]:
    prefix, _ = slot_range(layout, base)
    found = []
    for kv in kvs:
        name = ops.unb64(kv["key"])
        suffix = name[len(prefix) :]
        position = None
        if suffix.isdigit() and not suffix.startswith(b"0") and int(suffix) <= MAX_PERMITS:
            position = int(suffix)
        record = records.decode(layout, kv)
        if record is not None and (record.base != base or record.permit != position):
            record = None  # a plain lease on a key named like a slot
        token, mod = int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0))
        found.append(Seen(position, name, token, mod, int(kv.get("lease", 0)), record))
    return found


def live_slots(found: list[Seen]) -> list[Seen]:
    return [one for one in found if one.record is not None]


def first_kv(response: Json) -> Json | None:
    kvs = ops.kvs(response)
    return kvs[0] if kvs else None


def body_of(kv: Json | None) -> dict[str, Any]:
    if kv is None:
        return {}
    raw = ops.unb64(kv.get("value", ""))
    try:
        body = json.loads(raw.partition(records.SEP)[2])
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
