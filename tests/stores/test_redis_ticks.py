"""RedisStore's tick records against a real redis-server: the record's layout (a string next to the
lease, in its hash slot, never expiring), what the previous release's scripts and an operator's
release leave of it, the calls each costs, the documented ACL, Redis Cluster (the contract's cases
are in test_contract.py, through django_locks/testing/tick_cases.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from django_locks.exceptions import StoreError
from django_locks.stores.base import TickRecord
from django_locks.stores.redis import RedisStore, scripts
from django_locks.stores.redis import scripts_ticks as tick_scripts
from tests.stores.test_redis import DOCUMENTED_ACL, _sent
from tests.stores.test_redis_preempt import WORKER, _grant, _old, _owner, _taken

TICK = 1_767_225_600_000


@pytest.fixture
def store(redis_server: Any) -> Iterator[RedisStore]:
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    yield store
    store.clear()
    store.close()


def test_the_record_lives_in_the_lease_s_hash_slot_and_its_script_touches_nothing_else():
    store = RedisStore(url="redis://h/0")
    assert type(store).supports_ticks is True
    for key in ("k", "{braces}", "\U0001d11e" * 500):
        names = scripts.names(store.prefix, key)
        assert names.tick == names.lease[: -len(b"lease")] + b"tick"
        assert key_slot(names.tick) == key_slot(names.lease) == key_slot(names.fence)
    names = scripts.names(store.prefix, "k")
    call = tick_scripts.record_tick_call(names, "me", TICK)
    assert call == scripts.pack(
        "EVALSHA", tick_scripts.RECORD_TICK.sha, 2, names.lease, names.tick, "me", TICK, "k"
    )
    assert not tick_scripts.RECORD_TICK.idempotent  # never sent twice after a dropped connection
    assert tick_scripts.tick_pattern("a*b") == "a\\*b:{*}:tick"


@pytest.mark.redis
def test_the_record_is_a_string_of_the_tick_and_the_token_that_never_expires(store, redis_server):
    owner, names = _owner(), scripts.names(store.prefix, "k")
    token = _taken(store, "k", owner, ttl_ms=200)
    assert store.record_tick("k", owner, TICK)
    with redis_server.client() as client:
        assert client.get(names.tick) == b"%d:%d" % (TICK, token)
        assert client.pttl(names.tick) == -1  # no expiry, as the fencing counter
        assert client.hgetall(names.lease).keys() == {
            b"key",
            b"owner",
            b"holder",
            b"kind",
            b"detail",
            b"token",
            b"acquired_at",
        }  # the lease has no field of it
    store.warp(1_000)  # expired: the lease is deleted, the record kept
    with redis_server.client() as client:
        assert not client.exists(names.lease)
        assert client.get(names.tick) == b"%d:%d" % (TICK, token)
    assert store.recorded_tick("k") == TickRecord(TICK, token)


@pytest.mark.redis
def test_the_previous_release_s_scripts_and_an_operator_s_release_leave_the_record(
    store, redis_server
):
    owner, names = _owner(), scripts.names(store.prefix, "k")
    token = _taken(store, "k", owner)
    assert store.record_tick("k", owner, TICK)
    with redis_server.client() as client:
        assert _old(client, scripts.RELEASE, names, owner) == 1
        newer = _old(client, scripts.ACQUIRE, names, "old", 60_000, "h:1", "k")
        assert newer > token
        assert _old(client, scripts.RENEW, names, "old", 60_000) == 1
        assert _old(client, scripts.FORCE_RELEASE, names) == 1
    assert store.recorded_tick("k") == (TICK, token)
    # A lease a 0.1.0 process wrote has the fields the script reads: its owner could record.
    with redis_server.client() as client:
        newest = _old(client, scripts.ACQUIRE, names, "old", 60_000, "h:1", "k")
    assert store.record_tick("k", "old", TICK + 1)
    assert store.recorded_tick("k") == (TICK + 1, newest)
    assert store.force_release("k")
    assert store.recorded_tick("k") == (TICK + 1, newest)
    # A key taken with permits, its slots, its record: the same.
    grant = _grant(store, "k", owner, 2)
    assert store.record_tick("k", owner, TICK + 2) is False
    assert store.record_tick("k", "permits", TICK + 2) is False
    assert store.recorded_tick("k") == (TICK + 1, newest)
    assert store.force_release("k") and grant.fencing_token > newest


@pytest.mark.redis
def test_a_record_written_by_something_else_is_a_store_error(store, redis_server):
    with redis_server.client() as client:
        client.set(scripts.names(store.prefix, "k").tick, b"not a record")
    with pytest.raises(StoreError, match="'<tick_ms>:<token>'"):
        store.recorded_tick("k")


@pytest.mark.redis
def test_record_tick_is_one_script_call_and_recorded_tick_one_get(make_redis_server):
    server = make_redis_server()
    store = RedisStore(url=server.url, max_connections=1)
    owner = _owner()
    token = _taken(store, "k", owner)
    with server.client() as client:
        client.script_load(tick_scripts.RECORD_TICK.body)
    assert _sent(server, lambda: store.record_tick("k", owner, TICK)) == (True, ["EVALSHA"])
    assert _sent(server, lambda: store.record_tick("k", _owner(), TICK)) == (False, ["EVALSHA"])
    assert _sent(server, lambda: store.recorded_tick("k")) == ((TICK, token), ["GET"])
    assert _sent(server, lambda: store.recorded_tick("free")) == (None, ["GET"])
    server.script_flush()  # loaded again by the call itself
    assert store.record_tick("k", owner, TICK + 1) is True
    store.clear()
    store.close()


@pytest.mark.redis
def test_the_documented_acl_is_enough_for_tick_records(redis_server):
    with redis_server.client() as client:
        client.execute_command("ACL", "SETUSER", "locks", *DOCUMENTED_ACL.split())
    url = f"redis://locks:locks-secret@127.0.0.1:{redis_server.port}/0"
    store = RedisStore(url=url, prefix="acltest")
    redis_server.script_flush()
    owner = _owner()
    token = store.acquire_as("tick", owner, 30_000, WORKER)
    assert isinstance(token, int)
    assert store.record_tick("tick", owner, TICK)
    assert store.recorded_tick("tick") == (TICK, token)
    store.clear()
    assert store.recorded_tick("tick") is None
    store.close()


@pytest.mark.redis
def test_on_a_cluster_records_live_on_every_master_and_clear_deletes_them_all(redis_cluster):
    store = RedisStore(url=redis_cluster.url, cluster=True, prefix=f"t{uuid.uuid4().hex[:8]}")
    tokens = {}
    for i in range(30):
        owner = _owner()
        tokens[i] = _taken(store, f"beat:{i}", owner)
        assert store.record_tick(f"beat:{i}", owner, TICK + i)
    deadline = time.monotonic() + 5
    nodes = {store._node_for(store._keys(f"beat:{i}")[0], deadline) for i in range(30)}
    assert len(nodes) == 3
    store.force_release("beat:0")
    for i in range(30):
        assert store.recorded_tick(f"beat:{i}") == (TICK + i, tokens[i])
    store.clear()
    assert all(store.recorded_tick(f"beat:{i}") is None for i in range(30))
    assert store.leases() == []
    store.close()
