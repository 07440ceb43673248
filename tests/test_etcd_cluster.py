"""The suite's etcd cluster itself (tests/servers/etcd.py): every endpoint serves, a leader SIGKILL
elects another and loses nothing, a paused member does not stop writes through the others, and a
whole-cluster SIGKILL and restart keeps the data. Through etcd3gw, the client the store uses."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.waiting import eventually

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


def key() -> str:
    return f"test_etcd_cluster/{uuid.uuid4().hex}"


def read(member: Any, name: str) -> tuple[bytes, dict[str, Any]]:
    """The value and metadata of ``name`` by a linearizable read through ``member``."""
    found = member.client().get(name, metadata=True)
    assert len(found) == 1, f"{name} through {member}: {found}"
    value, meta = found[0]
    return value, meta


def followers(cluster: Any, leader: int) -> list[Any]:
    return [member for index, member in enumerate(cluster.members) if index != leader]


def test_every_endpoint_writes_and_reads_every_other(etcd: Any) -> None:
    assert len(etcd.endpoints) == 3
    assert all(url.startswith("http://127.0.0.1:") for url in etcd.endpoints)
    ports = {m.client_port for m in etcd.members} | {m.peer_port for m in etcd.members}
    assert len(ports) == 6 and not ports & {2379, 2380}
    for writer in etcd.members:
        name = key()
        writer.client().put(name, writer.name)
        for reader in etcd.members:
            assert read(reader, name)[0] == writer.name.encode()


def test_leader_sigkill_elects_another_and_keeps_the_key(etcd: Any) -> None:
    old = etcd.wait_for_leader()
    survivor = followers(etcd, old)[0]
    name = key()
    survivor.client().put(name, "before")
    _, before = read(survivor, name)

    etcd.member(old).kill()
    new = etcd.wait_for_leader(timeout=15, other_than=old)

    assert new != old and etcd.member(new).running
    value, after = read(etcd.member(new), name)
    assert value == b"before"
    assert after["create_revision"] == before["create_revision"]
    # The two survivors are a quorum: writes go on, the key's creation stays where it was.
    survivor.client().put(name, "after")
    _, rewritten = read(etcd.member(new), name)
    assert rewritten["create_revision"] == before["create_revision"]
    assert int(rewritten["mod_revision"]) > int(before["mod_revision"])

    etcd.member(old).start()  # back on its data: it catches up as a follower
    assert read(etcd.member(old), name)[0] == b"after"


def test_a_paused_member_does_not_stop_writes_through_the_others(etcd: Any) -> None:
    from etcd3gw.exceptions import ConnectionTimeoutError

    leader = etcd.wait_for_leader()
    paused = followers(etcd, leader)[0]
    others = [member for member in etcd.members if member is not paused]
    name = key()
    paused.pause()
    try:
        for number, member in enumerate(others):
            member.client(timeout=2).put(name, f"while paused {number}")
        assert read(others[0], name)[0] == b"while paused 1"
        # The paused member accepts the connection and answers nothing: the client's timeout.
        with pytest.raises(ConnectionTimeoutError):
            paused.client(timeout=0.5).get(name)
    finally:
        paused.resume()
    eventually(
        lambda: read(paused, name)[0] == b"while paused 1",
        timeout=10,
        what=f"{paused} caught up after SIGCONT",
        ignoring=(Exception,),
    )

    # A paused leader: the others elect one of themselves and take writes again.
    etcd.member(leader).pause()
    try:
        survivors = followers(etcd, leader)
        eventually(
            lambda: survivors[0].client(timeout=1).put(name, "leader paused"),
            timeout=15,
            what="a write through a follower while the leader is paused",
            every=0.05,
            ignoring=(Exception,),
        )
        assert etcd.wait_for_leader(timeout=10, other_than=leader) != leader
        assert read(survivors[1], name)[0] == b"leader paused"
    finally:
        etcd.member(leader).resume()


def test_whole_cluster_sigkill_and_restart_keeps_the_data(etcd: Any) -> None:
    names = [key() for _ in range(3)]
    for number, name in enumerate(names):
        etcd.member(number).client().put(name, f"value {number}")
    before = {name: read(etcd.member(0), name)[1] for name in names}

    etcd.restart_all(hard=True)

    for member in etcd.members:
        for number, name in enumerate(names):
            value, meta = read(member, name)
            assert value == f"value {number}".encode()
            assert meta["create_revision"] == before[name]["create_revision"]
            assert meta["mod_revision"] == before[name]["mod_revision"]
    # The revision goes on from where it was, never back.
    last = max(int(meta["mod_revision"]) for meta in before.values())
    etcd.member(1).client().put(names[0], "after the restart")
    assert int(read(etcd.member(2), names[0])[1]["mod_revision"]) > last


def test_a_leader_paused_for_less_than_a_lease_ttl_revokes_no_lease(etcd: Any) -> None:
    """The other side of etcd issue 15247 (the etcd reference's limits): a leader stalled for
    longer than a lease's remaining TTL may revoke it on resuming, one stalled for less must
    not. 1 s pauses of the leader, 3 leases of 5 s kept alive through the other members."""
    from tests.faults.etcd_early_revoke import one_round

    try:
        early = [s for _ in range(2) for s in one_round(etcd, pause=1.0, ttl=5, leases=3)]
    finally:
        etcd.heal()
    assert early == [], f"leases lost {early} s after the leader's SIGCONT\n{etcd.logs(20)}"
