"""``RedisStore(min_replicas=..., replica_timeout=...)`` on a real master and replica: ``WAIT``
pipelined after each acquire's and renewal's script, a short answer a ``StoreError`` (the grant
released), the options refused without I/O, and W207."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_locks.exceptions import StoreError
from django_locks.holders import Holder
from django_locks.owners import new_owner
from django_locks.stores.base import Slot
from django_locks.stores.redis import RedisStore
from tests.servers.redis import RedisServer
from tests.stores.test_redis import DOCUMENTED_ACL
from tests.waiting import eventually

pytestmark = pytest.mark.redis


class Pair:
    """A master and one replica of it."""

    def __init__(self) -> None:
        self.master = RedisServer().start()
        self.replica = RedisServer({"replicaof": f"127.0.0.1 {self.master.port}"}).start()
        eventually(self.linked, timeout=20, what="the replica linked to its master", every=0.05)

    def linked(self) -> bool:
        """The replica online (its initial sync done): WAIT counts it from then on."""
        with self.master.client() as client:
            info = client.info("replication")
        with self.replica.client() as client:
            up = client.info("replication")["master_link_status"] == "up"
        return bool(up and info.get("slave0", {}).get("state") == "online")

    def pause_replica(self) -> None:
        assert self.replica.process is not None
        os.kill(self.replica.process.pid, signal.SIGSTOP)

    def resume_replica(self) -> None:
        assert self.replica.process is not None
        os.kill(self.replica.process.pid, signal.SIGCONT)

    def waits(self) -> int:
        """How many WAITs the master has run."""
        with self.master.client() as client:
            stats = client.info("commandstats").get("cmdstat_wait", {})
            return int(stats.get("calls", 0))

    def destroy(self) -> None:
        self.resume_replica()
        self.replica.destroy()
        self.master.destroy()


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    servers = Pair()
    yield servers
    servers.destroy()


@pytest.fixture
def paused(pair: Pair) -> Iterator[Pair]:
    pair.pause_replica()
    try:
        yield pair
    finally:
        pair.resume_replica()
        eventually(pair.linked, timeout=20, what="the replica linked again", every=0.05)


def holder() -> Holder:
    return Holder.parse("test:1")


def test_every_acquire_and_renewal_is_confirmed_in_its_own_round_trip(pair: Pair) -> None:
    store = RedisStore(url=pair.master.url, min_replicas=1, replica_timeout=1)
    key, owner = f"replicas:{new_owner()}", new_owner()
    # The scripts loaded (a first call's NOSCRIPT sends the pair again, WAIT included).
    assert type(store.acquire_as(f"{key}:warm", owner, 5_000, holder())) is int
    assert store.renew(f"{key}:warm", owner, 5_000) is True
    before = pair.waits()
    token = store.acquire_as(key, owner, 5_000, holder())
    assert type(token) is int
    assert store.renew(key, owner, 5_000) is True
    other = f"replicas:{new_owner()}"
    assert type(store.acquire_as(other, owner, 5_000, holder())) is int
    assert store.renew_many([(key, owner, 5_000), (other, owner, 5_000)]) == [True, True]
    assert pair.waits() - before == 4  # two acquires, a renewal, one batch
    with pair.replica.client() as replica:  # the replica has the lease the master granted
        assert replica.keys("django_locks:*{*}:lease")
    # A refused acquire is an answer, whatever WAIT said: the holder, no error.
    refused = store.acquire_as(key, new_owner(), 5_000, holder())
    assert isinstance(refused, Holder) and refused.host == holder().host
    assert store.release(key, owner) and store.release(other, owner)


def test_an_unconfirmed_acquire_is_a_store_error_and_the_grant_is_released(paused: Pair) -> None:
    store = RedisStore(url=paused.master.url, min_replicas=1, replica_timeout=0.05)
    key, owner = f"replicas:{new_owner()}", new_owner()
    with pytest.raises(StoreError) as raised:
        store.acquire_as(key, owner, 30_000, holder())
    message = str(raised.value)
    assert f"The lock {key!r} was granted on the master of Redis 127.0.0.1" in message
    assert "confirmed by 0 of 1 replicas within 50 ms; released." in message
    assert "INFO replication" in message and "replica_timeout" in message
    # Released: another process takes it at once (no WAIT on this store).
    plain = RedisStore(url=paused.master.url)
    assert type(plain.acquire(key, new_owner(), 30_000)) is int


def test_an_unconfirmed_permit_is_released_too(paused: Pair) -> None:
    store = RedisStore(url=paused.master.url, min_replicas=1, replica_timeout=0.05)
    key = f"replicas:{new_owner()}"
    with pytest.raises(StoreError, match="confirmed by 0 of 1 replicas"):
        store.acquire_permit(key, new_owner(), 30_000, 2, holder())
    plain = RedisStore(url=paused.master.url)
    grants = [plain.acquire_permit(key, new_owner(), 30_000, 2, holder()) for _ in range(2)]
    assert sorted(grant.permit for grant in grants) == [1, 2]  # type: ignore[union-attr]


def test_unconfirmed_renewals_are_store_errors(pair: Pair) -> None:
    store = RedisStore(url=pair.master.url, min_replicas=1, replica_timeout=0.05)
    key, owner = f"replicas:{new_owner()}", new_owner()
    grant = store.acquire_permit(f"{key}:p", owner, 30_000, 2, holder())
    assert type(store.acquire_as(key, owner, 30_000, holder())) is int
    slot = Slot(f"{key}:p", grant.permit)  # type: ignore[union-attr]
    pair.pause_replica()
    try:
        with pytest.raises(StoreError, match=r"A renewal on the master .* 0 of 1 replicas"):
            store.renew(key, owner, 30_000)
        with pytest.raises(StoreError, match=r"A renewal of 2 leases .* 0 of 1 replicas"):
            store.renew_many([(key, owner, 30_000), (slot, owner, 30_000)])
        # A refused renewal is an answer, not an error.
        assert store.renew(key, new_owner(), 30_000) is False
    finally:
        pair.resume_replica()
        eventually(pair.linked, timeout=20, what="the replica linked again", every=0.05)
    assert store.renew_many([(key, owner, 30_000), (slot, owner, 30_000)]) == [True, True]


def test_a_flushed_script_is_loaded_and_confirmed_in_the_same_call(pair: Pair) -> None:
    store = RedisStore(url=pair.master.url, min_replicas=1, replica_timeout=1)
    key, owner = f"replicas:{new_owner()}", new_owner()
    assert type(store.acquire_as(key, owner, 5_000, holder())) is int
    pair.master.script_flush()
    assert store.renew(key, owner, 5_000) is True
    assert store.release(key, owner)


def test_w207_when_fewer_replicas_are_connected_than_asked(pair: Pair) -> None:
    assert RedisStore(url=pair.master.url, min_replicas=1).check(deploy=True) == []
    [warning] = RedisStore(url=pair.master.url, min_replicas=2).check(deploy=True)
    assert warning.id == "django_locks.W207"
    assert "'min_replicas' is 2" in warning.msg and "1 connected replica " in warning.msg
    assert "replicaof" in warning.hint and "lower min_replicas" in warning.hint
    assert RedisStore(url=pair.master.url).check(deploy=True) == []  # no INFO asked


def test_the_documented_acl_is_enough_with_min_replicas(pair: Pair) -> None:
    """The deployment guide's user, created on the master and the replica, acquires, renews and
    checks with ``min_replicas`` (``+wait``, ``+info``)."""
    for server in (pair.master, pair.replica):
        with server.client() as client:
            client.execute_command("ACL", "SETUSER", "locks", *DOCUMENTED_ACL.split())
    url = f"redis://locks:locks-secret@127.0.0.1:{pair.master.port}/0"
    store = RedisStore(url=url, prefix="acltest", min_replicas=1, replica_timeout=1)
    key, owner = f"acl:{new_owner()}", new_owner()
    assert type(store.acquire_as(key, owner, 5_000, holder())) is int
    assert store.renew(key, owner, 5_000) is True
    assert store.renew_many([(key, owner, 5_000)]) == [True]
    assert store.check(deploy=True) == []
    assert store.release(key, owner)
    with pair.replica.client() as replica:  # the replica accepts the same login
        assert replica.execute_command("AUTH", "locks", "locks-secret")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"min_replicas": -1}, "'min_replicas' must be an int of 0 to 1000"),
        ({"min_replicas": True}, "'min_replicas' must be an int of 0 to 1000"),
        ({"min_replicas": "1"}, "'min_replicas' must be an int of 0 to 1000"),
        ({"min_replicas": 1.0}, "'min_replicas' must be an int of 0 to 1000"),
        ({"min_replicas": 10**20}, "'min_replicas' must be an int of 0 to 1000"),
        ({"min_replicas": 1, "cluster": True}, "not available with cluster=True"),
        ({"min_replicas": 1, "replica_timeout": 0}, "replica_timeout"),
        ({"min_replicas": 1, "replica_timeout": -1}, "replica_timeout"),
        ({"min_replicas": 1, "replica_timeout": "soon"}, "replica_timeout"),
        ({"min_replicas": 1, "replica_timeout": 5}, "must be shorter than 'socket_timeout'"),
    ],
)
def test_bad_options_are_refused_without_io(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=says):
        RedisStore(url="redis://127.0.0.1:1/0", **options)


def test_a_refused_wait_confirms_nothing_and_the_grant_is_released(caplog: Any) -> None:
    server = RedisServer(extra=("--rename-command", "WAIT", "")).start()
    try:
        store = RedisStore(url=server.url, min_replicas=1, replica_timeout=0.05)
        key = f"replicas:{new_owner()}"
        with pytest.raises(StoreError, match="confirmed by 0 of 1 replicas within 50 ms; released"):
            store.acquire_as(key, new_owner(), 30_000, holder())
        assert "refused WAIT" in caplog.text and "allow WAIT" in caplog.text
        assert type(RedisStore(url=server.url).acquire(key, new_owner(), 30_000)) is int
    finally:
        server.destroy()
