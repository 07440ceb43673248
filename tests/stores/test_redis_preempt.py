"""RedisStore's preempt requests against a real redis-server: the request's layout (a field of the
lease it asks, gone with that lease), preempt racing renewals, what the previous release's scripts
and processes make of a lease carrying one, the calls each costs (the contract's cases are in
test_contract.py, through django_locks/testing/preempt_cases.py)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import django_locks
from django_locks.holders import Holder
from django_locks.stores.base import PREEMPTED, PermitGrant, Renewed, Slot
from django_locks.stores.redis import RedisStore, scripts, wire
from django_locks.stores.redis import scripts_permits as permit_scripts
from django_locks.stores.redis import scripts_preempt as preempt_scripts
from tests.stores.test_redis import _sent
from tests.test_rolling_upgrade import PREVIOUS_VERSION, previous_release, steps
from tests.waiting import eventually

__all__ = ["previous_release"]  # the fixture, shared with tests/test_rolling_upgrade.py

WORKER = Holder(host="web-2", pid=4121, kind="worker", detail="task-1")


def _owner() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def store(redis_server: Any) -> Iterator[RedisStore]:
    store = RedisStore(url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}")
    yield store
    store.clear()
    store.close()


def _taken(store: RedisStore, key: str, owner: str, ttl_ms: int = 60_000) -> int:
    token = store.acquire_as(key, owner, ttl_ms, WORKER)
    assert type(token) is int, token
    return token


def _grant(store: RedisStore, key: str, owner: str, permits: int, ttl_ms: int = 60_000) -> Any:
    got = store.acquire_permit(key, owner, ttl_ms, permits, WORKER)
    assert isinstance(got, PermitGrant), got
    return got


def _stored(redis_server: Any, store: RedisStore) -> set[bytes]:
    """Every Redis key under the store's prefix."""
    with redis_server.client() as client:
        return set(client.scan_iter(match=f"{store.prefix}:*", count=1000))


# The layout: a field of the lease it asks.


def test_the_preempt_script_touches_the_key_s_hash_tag_only():
    store = RedisStore(url="redis://h/0")
    names = scripts.names(store.prefix, "k")
    call = preempt_scripts.preempt_call(names)
    assert call == scripts.pack("EVALSHA", preempt_scripts.PREEMPT.sha, 1, names.lease, "k")
    assert preempt_scripts.PREEMPT.idempotent  # sent again after a dropped connection: the same
    assert type(store).supports_preempt is True


@pytest.mark.redis
def test_the_request_is_the_preempt_field_of_the_lease_naming_its_token(store, redis_server):
    owner = _owner()
    token = _taken(store, "k", owner)
    names = scripts.names(store.prefix, "k")
    before = _stored(redis_server, store)
    assert store.preempt("k") == token
    assert store.preempt("k") == token  # again: the same request
    with redis_server.client() as client:
        lease = client.hgetall(names.lease)
    assert lease[b"preempt"] == lease[b"token"] == b"%d" % token
    assert _stored(redis_server, store) == before == {names.lease, names.fence}  # no key of its own
    assert store.renew("k", owner, 60_000) == PREEMPTED
    info = store.lease("k")
    assert info is not None and (info.owner, info.fencing_token) == (owner, token)


@pytest.mark.redis
def test_under_permits_the_request_is_a_field_of_the_oldest_slot(store, redis_server):
    owners = [_owner() for _ in range(3)]
    grants = [_grant(store, "k", owner, 3) for owner in owners]
    assert store.release(Slot("k", 1), owners[0])
    owners[0] = _owner()
    grants[0] = _grant(store, "k", owners[0], 3)  # slot 1 again: now the newest token
    assert grants[0].permit == 1 and grants[1].fencing_token < grants[2].fencing_token
    assert store.preempt("k") == grants[1].fencing_token
    names = scripts.names(store.prefix, "k")
    with redis_server.client() as client:
        asked = {
            n: client.hget(permit_scripts.slot_names(store.prefix, "k", n)[0], "preempt")
            for n in (1, 2, 3)
        }
        record = client.hgetall(names.lease)
    assert asked == {1: None, 2: b"%d" % grants[1].fencing_token, 3: None}
    assert b"preempt" not in record  # the record is nobody's lease
    answers = store.renew_many([(Slot("k", n), owners[n - 1], 60_000) for n in (1, 2, 3)])
    assert answers == [True, PREEMPTED, True]


@pytest.mark.redis
def test_a_request_expires_with_its_lease_and_nothing_of_it_stays(store, redis_server):
    plain, slot_owner, other = _owner(), _owner(), _owner()
    token = _taken(store, "plain", plain, ttl_ms=300)
    grant = _grant(store, "permits", slot_owner, 2, ttl_ms=300)
    _grant(store, "permits", other, 2, ttl_ms=60_000)  # a later token: not the one asked
    assert store.preempt("plain") == token
    assert store.preempt("permits") == grant.fencing_token
    assert store.renew("plain", plain, 60_000) == PREEMPTED
    assert store.renew(Slot("permits", grant.permit), slot_owner, 60_000) == PREEMPTED
    plain_names = scripts.names(store.prefix, "plain")
    slot = permit_scripts.slot_names(store.prefix, "permits", grant.permit)[0]
    with redis_server.client() as client:
        assert 0 < client.pttl(plain_names.lease) <= 300  # not extended by the renewal
        assert 0 < client.pttl(slot) <= 300
    eventually(lambda: store.lease("plain") is None, timeout=5, what="the asked lease lapsed")
    eventually(partial(_free, store, f"permits#{grant.permit}"), timeout=5, what="slot lapsed")
    left = _stored(redis_server, store)
    assert plain_names.lease not in left and slot not in left  # the requests went with them
    assert plain_names.fence in left  # the counter stays, as for every lease
    with redis_server.client() as client:  # the other slot's lease and the record: no request
        assert all(b"preempt" not in client.hgetall(name) for name in left if b":lease" in name)
    # The next holders are asked by nothing.
    newer = _taken(store, "plain", other)
    assert newer > token and store.renew("plain", other, 60_000) is True
    again = _grant(store, "permits", plain, 2)
    assert again.permit == grant.permit and again.fencing_token > grant.fencing_token
    assert store.renew(Slot("permits", again.permit), plain, 60_000) is True


@pytest.mark.redis
def test_a_released_lease_takes_its_request_with_it(store, redis_server):
    owner = _owner()
    _taken(store, "k", owner)
    store.preempt("k")
    assert store.release("k", owner)
    names = scripts.names(store.prefix, "k")
    assert names.lease not in _stored(redis_server, store)
    assert store.preempt("k") is None


@pytest.mark.redis
def test_leave_is_the_holder_s_last_word_whatever_the_request(store, redis_server):
    """``leave`` (``"max hold"`` included) moves the expiry as it always did: a preempted
    holder that leaves its lease to lapse is not refused (its renewals are)."""
    owner, slot_owner = _owner(), _owner()
    _taken(store, "k", owner)
    grant = _grant(store, "p", slot_owner, 2)
    store.preempt("k")
    store.preempt("p")
    assert store.leave("k", owner, 500, "max hold") is True
    assert store.leave(Slot("p", grant.permit), slot_owner, 500, "max hold") is True
    with redis_server.client() as client:
        assert 0 < client.pttl(scripts.names(store.prefix, "k").lease) <= 500
    assert store.renew("k", owner, 60_000) == PREEMPTED
    assert store.leave("k", _owner(), 500, "max hold") is False  # another owner's: refused


# Preempt racing renewals on a real server.


def _renewing(
    store: RedisStore,
    batch: list[tuple[str, str, int]],
    stop: threading.Event,
    answers: list[tuple[float, list[Renewed]]],
    errors: list[BaseException],
    *,
    one_by_one: bool,
) -> None:
    """Renew ``batch`` until ``stop``, as a renewer does, recording when each call was sent and
    its answers."""
    try:
        while not stop.is_set():
            sent = time.monotonic()
            if one_by_one:
                got = [store.renew(key, owner, ttl_ms) for key, owner, ttl_ms in batch]
            else:
                got = store.renew_many(batch)
            answers.append((sent, got))
    except BaseException as exc:
        errors.append(exc)


@contextlib.contextmanager
def _running(threads: list[threading.Thread], stop: threading.Event) -> Iterator[None]:
    """``threads`` started, then stopped (``stop`` set) and joined however the block ends: a
    failed test leaves none renewing behind it."""
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


@pytest.mark.redis
@pytest.mark.slow
def test_preempt_racing_renewals_answers_every_later_renewal_and_never_extends(store):
    """8 leases, each renewed in a tight loop by a thread of its own (half with ``renew``, half
    with ``renew_many`` next to a lease nobody asks), while 4 threads preempt them all at once.
    Each preempt names the lease's token; no renewal sent after a preempt of its lease
    returned renews it; a renewer's answers are renewed, then preempted, then refused (lapsed),
    never back; the asked leases lapse at their ttl from the request however hard they are renewed,
    and the lease nobody asked lives on."""
    ttl_ms = 1_500
    keys = [f"race:{n}" for n in range(8)]
    owners = {key: _owner() for key in keys}
    tokens = {key: _taken(store, key, owners[key], ttl_ms) for key in keys}
    kept = {key: (f"kept:{key}", _owner()) for key in keys[1::2]}  # renewed in a batch
    for kept_key, kept_owner in kept.values():
        _taken(store, kept_key, kept_owner, ttl_ms)
    stop = threading.Event()
    errors: list[BaseException] = []
    answers: dict[str, list[tuple[float, list[Renewed]]]] = {key: [] for key in keys}
    renewers = []
    for key in keys:
        batch = [(key, owners[key], ttl_ms)]
        if key in kept:
            batch.append((*kept[key], ttl_ms))
        args = (store, batch, stop, answers[key], errors)
        one_by_one = {"one_by_one": key not in kept}
        renewers.append(threading.Thread(target=_renewing, args=args, kwargs=one_by_one))
    with _running(renewers, stop):
        eventually(lambda: all(len(found) > 20 for found in answers.values()), timeout=10)
        asked: dict[str, list[tuple[float, float, int | None]]] = {key: [] for key in keys}
        barrier = threading.Barrier(4)

        def preempting() -> None:
            try:
                barrier.wait(timeout=10)
                for key in keys:
                    started = time.monotonic()
                    named = store.preempt(key)
                    asked[key].append((started, time.monotonic(), named))
            except BaseException as exc:
                errors.append(exc)

        preempters = [threading.Thread(target=preempting) for _ in range(4)]
        for thread in preempters:
            thread.start()
        for thread in preempters:
            thread.join(timeout=30)
        first_asked = {key: min(started for started, _, _ in asked[key]) for key in keys}
        answered = {key: min(done for _, done, _ in asked[key]) for key in keys}
        # Renewed as hard as before until each asked lease is gone (its ttl from the request).
        gone: dict[str, float] = {}  # when each was first seen gone

        def all_lapsed() -> bool:
            for key in keys:
                if key not in gone and _free(store, key):
                    gone[key] = time.monotonic()
            return len(gone) == len(keys)

        eventually(all_lapsed, timeout=10, what="the asked leases lapsed")
    assert errors == []
    for key in keys:
        assert {named for _, _, named in asked[key]} == {tokens[key]}, asked[key]
        mine = [got[0] for _, got in answers[key]]
        assert mine[0] is True and PREEMPTED in mine, mine
        turned = mine.index(PREEMPTED)
        assert all(answer is True for answer in mine[:turned]), mine
        # Then preempted until the lease lapsed (then refused), never renewed again.
        tail = mine[turned:]
        lapsed = tail.index(False) if False in tail else len(tail)
        assert all(answer == PREEMPTED for answer in tail[:lapsed]), tail
        assert all(answer is False for answer in tail[lapsed:]), tail
        for sent, got in answers[key]:  # none sent after a preempt returned renewed it
            if sent > answered[key]:
                assert got[0] is not True, (key, sent - answered[key], got)
        # Not extended: it lapsed within its ttl of the first request (and a little slack).
        assert gone[key] - first_asked[key] < ttl_ms / 1000 + 0.5, gone[key] - first_asked[key]
        if key in kept:  # renewed next to it all along: never asked, still held
            assert all(got[1] is True for _, got in answers[key]), answers[key]
            assert store.lease(kept[key][0]) is not None


def _free(store: RedisStore, key: str) -> bool:
    return store.lease(key) is None


@pytest.mark.redis
@pytest.mark.slow
def test_preempt_racing_slot_renewals_asks_the_oldest_holder_alone(store, redis_server):
    """4 permits, each renewed in a loop by its own thread in ``renew_many``; the preempt
    names the lowest token; only that slot's renewals turn ``PREEMPTED``, and it lapses at its
    ttl while the other three keep their slots and the key's record; a second preempt then asks
    the next oldest."""
    ttl_ms = 1_500
    owners = [_owner() for _ in range(4)]
    grants = [_grant(store, "sem", owner, 4, ttl_ms) for owner in owners]
    oldest = min(grants, key=lambda grant: grant.fencing_token)
    stop = threading.Event()
    errors: list[BaseException] = []
    answers: list[list[tuple[float, list[Renewed]]]] = [[] for _ in owners]
    renewers = [
        threading.Thread(
            target=_renewing,
            args=(store, [(Slot("sem", grant.permit), owner, ttl_ms)], stop, answers[n], errors),
            kwargs={"one_by_one": False},
        )
        for n, (grant, owner) in enumerate(zip(grants, owners, strict=True))
    ]
    with _running(renewers, stop):
        eventually(lambda: all(len(found) > 20 for found in answers), timeout=10)
        asked_at = time.monotonic()
        assert store.preempt("sem") == oldest.fencing_token
        asked_slot = Slot("sem", oldest.permit)
        eventually(partial(_free, store, asked_slot), timeout=10, what="the asked slot lapsed")
        lapsed = time.monotonic() - asked_at
        time.sleep(0.2)  # the others renew on a while after it
    assert errors == []
    assert lapsed < ttl_ms / 1000 + 0.5, lapsed
    for n, grant in enumerate(grants):
        mine = [got[0] for _, got in answers[n]]
        if grant is oldest:
            assert (
                mine[0] is True and PREEMPTED in mine and True not in mine[mine.index(PREEMPTED) :]
            )
        else:
            assert all(answer is True for answer in mine), (grant, mine)
    listed = {info.key: info for info in store.leases()}
    assert set(listed) == {"sem"} | {f"sem#{g.permit}" for g in grants if g is not oldest}
    next_oldest = min((g for g in grants if g is not oldest), key=lambda g: g.fencing_token)
    assert store.preempt("sem") == next_oldest.fencing_token


# The previous release's scripts (0.1.0's, byte for byte: tests/stores/test_redis.py pins their
# SHAs) on leases carrying a request: they ignore it.


def _old(client: Any, script: scripts.Script, names: scripts.Names, *args: Any) -> Any:
    """``script`` as a 0.1.0 process calls it on the key of ``names``."""
    keys = {
        scripts.ACQUIRE: (names.lease, names.fence),
        scripts.RENEW: (names.lease, names.fence),
        scripts.RELEASE: (names.lease, names.fence, names.released),
        scripts.FORCE_RELEASE: (names.lease, names.fence, names.released),
        scripts.INSPECT: (names.lease,),
    }[script]
    return client.eval(script.body, len(keys), *keys, *args)


@pytest.mark.redis
def test_the_previous_release_s_scripts_ignore_a_request(store, redis_server):
    owner, other, names = _owner(), _owner(), scripts.names(store.prefix, "k")
    token = _taken(store, "k", owner)
    assert store.preempt("k") == token
    with redis_server.client() as client:
        # Another 0.1.0 owner finds it held; its listing reads it; its owner renews it.
        assert _old(client, scripts.ACQUIRE, names, other, 60_000, "h:1", "k") is None
        key, listed_owner, _, listed_token, _, _ = _old(client, scripts.INSPECT, names)
        assert (key, listed_owner, listed_token) == (b"k", owner.encode(), b"%d" % token)
        client.pexpire(names.lease, 1_000)
        assert _old(client, scripts.RENEW, names, owner, 60_000) == 1
        assert client.pttl(names.lease) > 59_000  # renewed: 0.1.0 ignores the request
        # Its idempotent acquire keeps the lease, and the request with it.
        assert _old(client, scripts.ACQUIRE, names, owner, 60_000, "h:1", "k") == token
        assert client.hget(names.lease, "preempt") == b"%d" % token
    assert store.renew("k", owner, 60_000) == PREEMPTED  # this release's renewals still see it
    with redis_server.client() as client:
        assert _old(client, scripts.RELEASE, names, owner) == 1
        assert not client.exists(names.lease)  # the request went with the lease
        newer = _old(client, scripts.ACQUIRE, names, other, 60_000, "h:1", "k")
        assert newer > token and client.hget(names.lease, "preempt") is None
    assert store.renew("k", other, 60_000) is True  # the next holder, 0.1.0's: not asked
    # A lease 0.1.0 wrote is asked by this release's preempt (it has the fields read) ...
    assert store.preempt("k") == newer
    assert store.renew("k", other, 60_000) == PREEMPTED
    with redis_server.client() as client:
        # ... which 0.1.0's own renewals ignore; its operator's release frees it all.
        assert _old(client, scripts.RENEW, names, other, 60_000) == 1
        assert _old(client, scripts.FORCE_RELEASE, names) == 1
        assert not client.exists(names.lease)
    assert store.preempt("k") is None


@pytest.mark.redis
def test_the_previous_release_s_acquire_of_a_free_key_is_never_asked(store, redis_server):
    """A request dies with its lease, whoever acquires next: 0.1.0's acquire after the asked
    lease lapsed writes a lease without one."""
    owner, names = _owner(), scripts.names(store.prefix, "k")
    token = _taken(store, "k", owner, ttl_ms=200)
    store.preempt("k")
    eventually(lambda: store.lease("k") is None, timeout=5)
    with redis_server.client() as client:
        newer = _old(client, scripts.ACQUIRE, names, "old", 60_000, "h:1", "k")
        assert newer > token and client.hget(names.lease, "preempt") is None
    assert store.renew("k", "old", 60_000) is True


# The calls each costs.


@pytest.mark.redis
def test_preempt_and_a_preempted_renewal_are_one_script_call_each(make_redis_server):
    server = make_redis_server()
    store = RedisStore(url=server.url, max_connections=1)
    owner = _owner()
    token = _taken(store, "k", owner)
    grant = _grant(store, "p", owner, 2)
    for script in (preempt_scripts.PREEMPT, scripts.RENEW_RECORDED):
        with server.client() as client:
            client.script_load(script.body)
    one = ["EVALSHA"]
    assert _sent(server, lambda: store.preempt("k")) == (token, one)
    assert _sent(server, lambda: store.preempt("p")) == (grant.fencing_token, one)
    assert _sent(server, lambda: store.preempt("free")) == (None, one)
    assert _sent(server, lambda: store.renew("k", owner, 60_000)) == (PREEMPTED, one)
    slot = Slot("p", grant.permit)
    assert _sent(server, lambda: store.renew(slot, owner, 60_000)) == (PREEMPTED, one)
    batch = [("k", owner, 60_000), (slot, owner, 60_000)]
    assert _sent(server, lambda: store.renew_many(batch)) == (
        [PREEMPTED, PREEMPTED],
        ["SCRIPT", "EVALSHA", "EVALSHA"],  # one pipeline, as ever
    )
    store.clear()
    store.close()


@pytest.mark.redis
def test_the_preempt_script_is_loaded_again_after_a_script_flush(store, redis_server):
    owner = _owner()
    token = _taken(store, "k", owner)
    redis_server.script_flush()
    assert store.preempt("k") == token
    redis_server.script_flush()
    assert store.renew("k", owner, 60_000) == PREEMPTED
    redis_server.script_flush()
    assert store.renew_many([("k", owner, 60_000)]) == [PREEMPTED]


# Redis Cluster: each request on its key's master, renewals answered per lease.


@pytest.mark.redis
def test_on_a_cluster_each_master_answers_its_leases_in_one_pipeline(redis_cluster, monkeypatch):
    store = RedisStore(url=redis_cluster.url, cluster=True, prefix=f"t{uuid.uuid4().hex[:8]}")
    leases: list[tuple[str, str, int]] = []
    expected: list[Renewed] = []
    for i in range(30):
        owner = _owner()
        token = _taken(store, f"job:{i}", owner)
        if i % 3 == 0:
            assert store.preempt(f"job:{i}") == token
        leases.append((f"job:{i}", owner, 60_000))
        expected.append(PREEMPTED if i % 3 == 0 else True)
    for i in range(5):
        grants = [_grant(store, f"sem:{i}", _owner(), 3) for _ in range(3)]
        assert store.preempt(f"sem:{i}") == grants[0].fencing_token
    nodes = {store._node_for(store._keys(key)[0], time.monotonic() + 5) for key, _, _ in leases}
    assert len(nodes) == 3
    pipelines: list[Any] = []
    real = wire.Pool.pipeline

    def counted(pool: Any, commands: list[bytes], deadline: float) -> list[Any]:
        pipelines.append(pool.where)
        return real(pool, commands, deadline)

    monkeypatch.setattr(wire.Pool, "pipeline", counted)
    assert store.renew_many(leases) == expected
    assert len(pipelines) == len(set(pipelines)) == 3
    monkeypatch.undo()
    store.clear()
    assert store.leases() == []
    store.close()


# A process of the previous release (0.1.0's wheel, as tests/test_rolling_upgrade.py builds it)
# and one of this release on one Redis.


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_previous_release_process_ignores_requests_on_one_redis(
    previous_release: Path, redis_server: Any, postgres_server: Any, tmp_path: Path
) -> None:
    name = "rolling_upgrade_redis_preempt"
    conn = postgres_server.connect()
    try:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        conn.cursor().execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    database = postgres_server.database_settings(name)  # Django needs one; nothing migrated
    where = f"redis={redis_server.url}"

    def current(*actions: Any) -> Any:
        version = django_locks.__version__
        return steps(Path(sys.executable), version, database, where, tmp_path, *actions)

    def previous(*actions: Any) -> Any:
        python = previous_release / "python"
        return steps(python, PREVIOUS_VERSION, database, where, tmp_path, *actions)

    (old_token,) = previous(["acquire", "pre:old", "old-1", 60_000])
    asked_old, refused_old, new_token, asked_new = current(
        ["preempt", "pre:old"],
        ["renew", "pre:old", "old-1", 60_000],
        ["acquire_as", "pre:new", "new-1", 60_000, "worker", "task-1"],
        ["preempt", "pre:new"],
    )
    assert (asked_old, refused_old) == (old_token, PREEMPTED)
    assert isinstance(new_token, int) and asked_new == new_token
    renewed_old, renewed_new, taken, listing, released, again = previous(
        ["renew", "pre:old", "old-1", 60_000],
        ["renew", "pre:new", "new-1", 60_000],
        ["acquire", "pre:new", "old-2", 60_000],
        ["leases"],
        ["release", "pre:old", "old-1"],
        ["acquire", "pre:old", "old-3", 60_000],
    )
    # 0.1.0 renews through the requests, finds the asked key held and lists both.
    assert (renewed_old, renewed_new, taken) == (True, True, None)
    states = {info["key"]: info["state"] for info in listing if info["key"].startswith("pre:")}
    assert states == {"pre:old": "held", "pre:new": "held"}, listing
    assert released is True and again > old_token
    fresh, still, ended, free = current(
        ["renew", "pre:old", "old-3", 60_000],  # the request went with the released lease
        ["renew", "pre:new", "new-1", 60_000],
        ["release", "pre:new", "new-1"],
        ["preempt", "pre:new"],
    )
    assert (fresh, still, ended, free) == (True, PREEMPTED, True, None)
    assert previous(["release", "pre:old", "old-3"]) == [True]
