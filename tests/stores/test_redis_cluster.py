"""RedisStore on a real 3-master Redis Cluster: routing, scripts, listing, checks (the contract is
in test_contract.py)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from redis.crc import key_slot

from django_locks.holders import Holder
from django_locks.stores.base import PermitGrant, Slot
from django_locks.stores.redis import RedisStore, wire


def _owner() -> str:
    return uuid.uuid4().hex


@pytest.mark.redis
def test_keys_spread_over_every_master_and_leases_lists_them_all(redis_cluster):
    store = RedisStore(url=redis_cluster.url, cluster=True, prefix=f"t{uuid.uuid4().hex[:8]}")
    keys = [f"job:{i}" for i in range(30)]
    for key in keys:
        assert store.acquire(key, _owner(), 60_000) is not None
    nodes = {store._node_for(store._keys(key)[0], time.monotonic() + 5) for key in keys}
    assert len(nodes) == 3
    assert [lease.key for lease in store.leases()] == sorted(keys)
    store.clear()
    assert store.leases() == []


@pytest.mark.redis
def test_script_flush_on_every_master_costs_no_failed_operation(redis_cluster):
    store = RedisStore(url=redis_cluster.url, cluster=True, prefix=f"t{uuid.uuid4().hex[:8]}")
    errors: list[BaseException] = []
    stop = threading.Event()
    count = {"ops": 0}

    def work(worker: int) -> None:
        try:
            while not stop.is_set():
                key, owner = f"k{worker}:{count['ops'] % 7}", _owner()
                assert store.acquire(key, owner, 30_000) is not None
                assert store.release(key, owner)
                count["ops"] += 2
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    flushes = 0
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not errors:
        time.sleep(0.05)
        redis_cluster.script_flush()
        flushes += 1
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert flushes >= 10 and count["ops"] > 100


@pytest.mark.redis
def test_a_stale_slot_map_follows_moved(redis_cluster):
    # A client whose map is wrong (a resharding it has not seen) is redirected by MOVED and
    # remembers the slot's new owner; simulated by pointing the slot at the wrong master.
    store = RedisStore(url=redis_cluster.url, cluster=True, prefix=f"t{uuid.uuid4().hex[:8]}")
    owner = _owner()
    token = store.acquire("moving", owner, 60_000)
    lease = store._keys("moving")[0]
    right = store._node_for(lease, time.monotonic() + 5)
    wrong = next(n for n in store._primaries(time.monotonic() + 5) if n != right)
    assert wrong is not None
    topology = store._process.get().cluster()
    topology.moved(key_slot(lease), wrong)
    assert store._node_for(lease, time.monotonic() + 5) == wrong
    assert store.acquire("moving", owner, 60_000) == token
    assert store._node_for(lease, time.monotonic() + 5) == right
    assert store.release("moving", owner)


@pytest.mark.redis
def test_checks_every_master(redis_cluster):
    store = RedisStore(url=redis_cluster.url, cluster=True)
    assert store.check(deploy=True) == []


@pytest.mark.redis
def test_permits_renew_in_one_pipeline_per_master(redis_cluster, monkeypatch):
    """Every slot of a key lives on its key's master (one hash tag): 30 keys of 3 permits,
    spread over the 3 masters, renew in one pipeline to each."""
    store = RedisStore(url=redis_cluster.url, cluster=True, prefix=f"t{uuid.uuid4().hex[:8]}")
    leases = []
    for i in range(30):
        for _ in range(3):
            owner = _owner()
            grant = store.acquire_permit(f"job:{i}", owner, 60_000, 3, Holder(host="h", pid=1))
            assert isinstance(grant, PermitGrant)
            leases.append((Slot(f"job:{i}", grant.permit), owner, 60_000))
    pipelines: list[Any] = []
    real = wire.Pool.pipeline

    def counted(pool: Any, commands: list[bytes], deadline: float) -> list[Any]:
        pipelines.append(pool.where)
        return real(pool, commands, deadline)

    monkeypatch.setattr(wire.Pool, "pipeline", counted)
    assert store.renew_many(leases) == [True] * 90
    assert len(pipelines) == len(set(pipelines)) == 3
    monkeypatch.undo()
    assert len(store.leases()) == 120  # 90 slots and 30 records
    store.clear()
    assert store.leases() == []
