"""RedisStore's permits against a real redis-server: the layout under the key's hash tag, what the
previous release's scripts make of it, the calls each operation costs (the contract is in
test_contract.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from django_locks.exceptions import PermitsMismatchError
from django_locks.holders import Holder
from django_locks.stores.base import PERMITS_OWNER, PermitGrant, Slot
from django_locks.stores.redis import RedisStore, scripts, wire
from django_locks.stores.redis import scripts_permits as permit_scripts
from tests.stores.test_redis import _sent

WORKER = Holder(host="web-2", pid=4121, kind="worker", detail="task-1")


def _owner() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def store(redis_server: Any) -> Iterator[RedisStore]:
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    yield store
    store.clear()
    store.close()


def _grant(store: RedisStore, key: str, owner: str, permits: int, ttl_ms: int = 60_000) -> Any:
    got = store.acquire_permit(key, owner, ttl_ms, permits, WORKER)
    assert isinstance(got, PermitGrant), got
    return got


# The layout: no server needed.


@pytest.mark.parametrize("key", ["plain", "{tag}", "a{b}c", "é" * 495, "k#2", "x:{y}:lease"])
def test_every_slot_and_the_key_s_record_share_the_key_s_hash_slot(key):
    store = RedisStore(url="redis://h/0")
    lease, fence = store._keys(key)
    for permit in (1, 2, 1000):
        slot, names = permit_scripts.slot_names(store.prefix, key, permit)
        assert names.lease == lease and slot == lease + b":%d" % permit
        assert key_slot(slot) == key_slot(lease) == key_slot(fence)


@pytest.mark.parametrize(
    ("key", "shaped"),
    [
        ("k#2", ("k", 2)),
        ("a#1#1000", ("a#1", 1000)),
        ("invoice#12", ("invoice", 12)),
        ("k#0", None),
        ("k#02", None),
        ("k#1001", None),
        ("#2", None),
        ("k#", None),
        ("k#2x", None),
        ("k", None),
    ],
)
def test_a_slot_s_key_is_told_by_its_shape(key, shaped):
    assert permit_scripts.slot_of(key) == shaped


def test_the_previous_release_lists_no_slot():
    # 0.1.0's SCAN pattern ends in ':lease': a slot's lease (':lease:<n>') never matches it.
    slot = permit_scripts.slot_names("p", "k", 3)[0]
    old = scripts.lease_pattern("p").encode()
    assert old.endswith(b"}:lease") and not slot.endswith(b"}:lease")
    assert scripts.lease_pattern("p", slots=True).endswith(":{*}:lease*")


# The previous release (0.1.0) and a key held by permits, both ways (SPEC section 9).


@pytest.mark.redis
def test_a_previous_release_process_finds_a_key_held_by_permits(store, redis_server):
    """0.1.0's own scripts, called as a 0.1.0 process calls them: its acquire of the key finds
    it held, its listing reads the record as a lease of owner "permits" expiring with the latest
    slot, its renewal and release of the key refuse."""
    names = scripts.names(store.prefix, "k")
    short, long = _grant(store, "k", _owner(), 3, 10_000), _grant(store, "k", _owner(), 3, 50_000)
    old_owner = _owner()
    with redis_server.client() as client:
        taken = client.eval(
            scripts.ACQUIRE_SCRIPT, 2, names.lease, names.fence, old_owner, 1000, "old:1", "k"
        )
        assert taken is None
        listed = client.eval(scripts.INSPECT_SCRIPT, 1, names.lease)
        assert listed[:2] == [b"k", PERMITS_OWNER.encode()]
        assert int(listed[3]) == long.fencing_token > short.fencing_token
        assert 49_000 < listed[5] <= 50_000
        assert client.eval(scripts.RENEW_SCRIPT, 2, names.lease, names.fence, old_owner, 1) == 0
        assert client.eval(scripts.RELEASE_SCRIPT, 3, *names[:3], old_owner) == 0
        assert client.pttl(names.lease) > 49_000


@pytest.mark.redis
def test_permits_are_refused_on_a_key_a_previous_release_process_holds(store, redis_server):
    names = scripts.names(store.prefix, "k")
    old_owner = _owner()
    with redis_server.client() as client:
        token = client.eval(
            scripts.ACQUIRE_SCRIPT, 2, names.lease, names.fence, old_owner, 60_000, "old:1", "k"
        )
        with pytest.raises(PermitsMismatchError) as raised:
            store.acquire_permit("k", _owner(), 60_000, 3, WORKER)
        assert (raised.value.permits, raised.value.live) == (3, 1)
        assert client.keys(f"{store.prefix}:*:lease:*") == []  # no slot written
        assert client.eval(scripts.RELEASE_SCRIPT, 3, *names[:3], old_owner) == 1
    assert _grant(store, "k", _owner(), 3).fencing_token > token


@pytest.mark.redis
def test_a_record_deleted_by_hand_is_written_again_and_its_live_slots_still_count(
    store, redis_server
):
    """0.1.0's operator release (``locks release`` of the old CLI) deletes the record alone:
    the slots stay live until they end, and this release still counts them."""
    names = scripts.names(store.prefix, "k")
    owners = [_owner(), _owner()]
    grants = [
        _grant(store, "k", owner, 2, ttl)
        for owner, ttl in zip(owners, (20_000, 40_000), strict=True)
    ]
    with redis_server.client() as client:
        assert client.eval(scripts.FORCE_RELEASE_SCRIPT, 3, *names[:3]) == 1
        full = store.acquire_permit("k", _owner(), 60_000, 2, WORKER)
        assert isinstance(full, Holder)
        assert store.acquire_permit("k", owners[0], 20_000, 2, WORKER) == grants[0]
        record = client.hgetall(names.lease)
        assert record[b"owner"] == b"permits" and record[b"permits"] == b"2"
        assert 39_000 < client.pttl(names.lease) <= 40_000  # as long as the latest slot


# The calls each operation costs: one script call, its answers all in its reply.


@pytest.mark.redis
def test_each_permit_operation_is_one_script_call(make_redis_server):
    server = make_redis_server()
    store = RedisStore(url=server.url, max_connections=1)
    owner, other = _owner(), _owner()
    # Connected, and every script loaded: what is counted below is the calls alone.
    grant = _grant(store, "k", owner, 2)
    for script in (permit_scripts.RELEASE_PERMIT, scripts.RENEW_RECORDED, scripts.ACQUIRE_AS):
        with server.client() as client:
            client.script_load(script.body)
    one = ["EVALSHA"]
    assert _sent(server, lambda: store.acquire_permit("k", owner, 60_000, 2, WORKER)) == (
        grant,
        one,
    )
    assert _sent(server, lambda: store.renew(Slot("k", grant.permit), owner, 60_000)) == (
        True,
        one,
    )
    taken, sent = _sent(server, lambda: store.acquire_permit("k", other, 60_000, 2, WORKER))
    assert isinstance(taken, PermitGrant) and sent == one
    full, sent = _sent(server, lambda: store.acquire_permit("k", _owner(), 60_000, 2, WORKER))
    assert isinstance(full, Holder) and sent == one

    def refused(call: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with pytest.raises(PermitsMismatchError) as raised:
                call()
            return raised.value.live

        return run

    assert _sent(server, refused(lambda: store.acquire_permit("k", owner, 1000, 3, WORKER))) == (
        2,
        one,
    )
    assert _sent(server, refused(lambda: store.acquire_as("k", owner, 1000, WORKER))) == (2, one)
    # A live slot's key, checked in the same script on a lone server; so is a plain key of that
    # shape, then taken.
    assert _sent(server, refused(lambda: store.acquire_as("k#1", owner, 1000, WORKER))) == (
        2,
        one,
    )
    token, sent = _sent(server, lambda: store.acquire_as("invoice#12", owner, 1000, WORKER))
    assert isinstance(token, int) and sent == one
    assert _sent(server, lambda: store.release(Slot("k", grant.permit), owner)) == (True, one)
    store.clear()
    store.close()


@pytest.mark.redis
def test_1000_held_permits_are_renewed_with_plain_locks_in_one_round_trip(
    store, redis_server, monkeypatch
):
    """50 keys of 20 permits and 10 plain locks, renewed in one ``renew_many``: one pipeline
    (the one round trip to a lone server), one script loaded, one script call a lease."""
    slots = []
    for k in range(50):
        for _ in range(20):
            owner = _owner()
            slots.append((Slot(f"key{k}", _grant(store, f"key{k}", owner, 20).permit), owner))
    plain = [(f"plain{i}", _owner()) for i in range(10)]
    for key, owner in plain:
        assert isinstance(store.acquire_as(key, owner, 60_000, WORKER), int)
    leases: list[tuple[str, str, int]] = [(key, owner, 120_000) for key, owner in slots + plain]
    trips: list[int] = []
    for method in ("call", "pipeline", "asking"):
        real = getattr(wire.Pool, method)

        def counted(pool: Any, *args: Any, real: Any = real, **kwargs: Any) -> Any:
            trips.append(1)
            return real(pool, *args, **kwargs)

        monkeypatch.setattr(wire.Pool, method, counted)
    with redis_server.client() as client:
        client.config_resetstat()
        assert store.renew_many(leases) == [True] * 1010
        stats = client.info("commandstats")
        records = [client.pttl(scripts.names(store.prefix, f"key{k}").lease) for k in range(50)]
    assert len(trips) == 1
    assert stats["cmdstat_evalsha"]["calls"] == 1010
    assert stats["cmdstat_script|load"]["calls"] == 1
    assert min(records) > 119_000  # every key's record moved with its slots
    assert store.renew_many([(Slot("key0", 1), _owner(), 1000)]) == [False]


@pytest.mark.redis
def test_permit_scripts_are_loaded_again_after_a_script_flush(store, redis_server):
    owner = _owner()
    redis_server.script_flush()
    grant = _grant(store, "k", owner, 2)
    slot = Slot("k", grant.permit)
    redis_server.script_flush()
    assert store.leave(slot, owner, 30_000, "lapsed")
    redis_server.script_flush()
    assert store.release(slot, owner)
    redis_server.script_flush()
    _grant(store, "k", owner, 2)
    assert store.force_release("k") and store.leases() == []
