"""EtcdStore's system checks: its options refused without I/O (E301-E303, a missing etcd3gw),
and, against real clusters (the suite's three members, killed, stopped or paused, and clusters
of one member), each cluster warning (W301-W308) with its fix."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_locks.stores.etcd import EtcdStore
from django_locks.stores.etcd.checks import CHECK_TIMEOUT, version_message
from tests.children.env import ROOT, child_env
from tests.waiting import eventually

pytestmark = pytest.mark.etcd

BACKEND = "django_locks.stores.EtcdStore"


def make_store(endpoints: list[str], **options: Any) -> EtcdStore:
    return EtcdStore(endpoints=endpoints, prefix=f"checks-{uuid.uuid4().hex[:8]}", **options)


def ids(messages: list[Any]) -> list[str]:
    return sorted(message.id for message in messages)


def by_id(messages: list[Any]) -> dict[str, Any]:
    found = {message.id: message for message in messages}
    assert len(found) == len(messages), messages
    return found


@pytest.fixture
def healthy_ttl() -> Iterator[None]:
    """LOCKS["TTL"] of 30 s, above the cluster's minimum lease TTL (2 s)."""
    with override_settings(LOCKS={"BACKEND": BACKEND, "TTL": "30s"}):
        yield


# Options: no I/O, each refusal its own id, naming the option and its rule.

BAD_OPTIONS = [
    ({"endpoints": []}, "E301", "must list at least one"),
    ({"endpoints": 2379}, "E301", "must be a list of the etcd members' client URLs"),
    ({"endpoints": b"http://h:2379"}, "E301", "must be a list"),
    ({"endpoints": ["127.0.0.1:2379"]}, "E301", "http:// or https:// URL with a host"),
    ({"endpoints": ["ftp://h:2379"]}, "E301", "got 'ftp://h:2379'"),
    ({"endpoints": ["http://"]}, "E301", "URL with a host"),
    ({"endpoints": ["http://h:2379", "http://h:99999"]}, "E301", "got 'http://h:99999'"),
    ({"endpoints": ["http://h:port"]}, "E301", "URL with a host"),
    ({"endpoints": [None]}, "E301", "got None"),
    ({"endpoints": ["http://h:2379/etcd"]}, "E301", "no path, query or user"),
    ({"endpoints": ["http://root:pw@h:2379"]}, "E301", "no path, query or user"),
    ({"prefix": ""}, "E302", "must be a non-empty str"),
    ({"prefix": 7}, "E302", "got 7"),
    ({"prefix": "a\x00b"}, "E302", "without NUL"),
    ({"prefix": "a\ud800"}, "E302", "encodes as UTF-8"),
    ({"timeout": "soon"}, "E303", "must be a positive duration"),
    ({"timeout": 0}, "E303", "got 0"),
    ({"timeout": True}, "E303", "got True"),
    ({"timeout": "400d"}, "E303", "at most 366 days"),
]


@pytest.mark.parametrize(("options", "check_id", "said"), BAD_OPTIONS)
def test_each_refused_option_has_its_error(options, check_id, said):
    [message] = EtcdStore.check_options(options)
    assert message.id == f"django_locks.{check_id}"
    [name] = options
    assert f"LOCKS['OPTIONS']['{name}']" in message.msg and said in message.msg
    assert f"LOCKS['OPTIONS']['{name}']" in message.hint
    # The store refuses it too: the check says what the constructor would not build.
    with pytest.raises((TypeError, ValueError)):
        EtcdStore(**options)


def test_a_mapping_or_set_of_endpoints_is_refused_by_the_check_and_the_store():
    # EtcdStore(endpoints={...}) iterated the dict (its keys taken as the URLs, in any order a
    # set would give): the check and the constructor both ask for the list the option is.
    for value in ({"http://h:2379": 1}, {"http://h:2379"}):
        [message] = EtcdStore.check_options({"endpoints": value})
        assert message.id == "django_locks.E301" and "must be a list" in message.msg
        with pytest.raises(ValueError, match="must be a list"):
            EtcdStore(endpoints=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"endpoints": "http://127.0.0.1:2379"},
        {"endpoints": ("https://etcd1", "http://[::1]:2379", "http://EtCd2:1")},
        {"prefix": "shop/locks", "timeout": "500ms"},
        {"timeout": 0.2},
    ],
)
def test_accepted_options_are_not_refused(options):
    assert EtcdStore.check_options(options) == []
    EtcdStore(**options)


def test_manage_py_check_reports_the_stores_own_ids():
    options = {"endpoints": ["localhost:2379"], "timeout": "soon"}
    with override_settings(LOCKS={"BACKEND": BACKEND, "OPTIONS": options}):
        with pytest.raises(SystemCheckError) as raised:
            call_command("check", "--tag", "django_locks")
    text = str(raised.value)
    assert "django_locks.E301" in text and "django_locks.E303" in text
    assert "django_locks.E001" not in text


def test_a_missing_etcd3gw_is_refused_at_startup_with_the_install_command():
    out = subprocess.run(
        [sys.executable, "-m", "tests.children.etcd_missing_client", BACKEND],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=child_env(),
    )
    assert out.stdout.startswith("ImproperlyConfigured"), out.stdout + out.stderr
    assert 'pip install "django-distributed-locks[etcd]"' in out.stdout


# The cluster: I/O only with --deploy or --database.


def test_no_io_without_deploy_or_databases():
    store = make_store(["http://127.0.0.1:1"])
    started = time.monotonic()
    assert store.check() == []
    assert store.check(databases=[]) == []
    assert store._process.peek() is None  # nothing was even set up for calls
    assert time.monotonic() - started < 0.5


def test_an_unresolvable_host_and_a_peer_port_are_named_as_such(etcd, healthy_ttl):
    peer = etcd.member(0).peer_url
    [message] = make_store(["http://no-such-host.invalid:2379", peer]).check(deploy=True)
    assert message.id == "django_locks.W301"
    assert "no-such-host.invalid:2379 could not be connected to: its host name does not " in (
        message.msg
    )
    assert "this looks like a member's peer URL (--listen-peer-urls" in message.msg


def test_silent_on_a_healthy_cluster(etcd, healthy_ttl):
    store = make_store(etcd.endpoints)
    assert store.check(deploy=True) == []
    assert store.check(databases=["default"]) == []


def test_a_killed_member_is_named_and_the_rest_still_checked(etcd, healthy_ttl):
    leader = etcd.wait_for_leader()
    index = next(i for i in range(3) if i != leader)
    etcd.member(index).kill()
    [message] = make_store(etcd.endpoints).check(deploy=True)
    assert message.id == "django_locks.W302"
    member = etcd.member(index)
    assert "1 of the 3 etcd endpoints" in message.msg
    assert f"member {member.name} at {member.url} could not be connected to" in message.msg
    # What happens next, exactly (the outsider's "may stop" said too little).
    assert "goes on through the other members while a majority (2 of 3) answers" in message.msg
    assert "one more member lost and no lock can be taken, renewed or released" in message.msg
    assert "etcdctl member remove" in message.hint


def test_a_cluster_without_a_majority_has_no_leader(etcd, healthy_ttl):
    for index in (0, 1):
        etcd.member(index).kill()
    # The survivor believes in the old leader until its election timeout has passed.
    eventually(
        lambda: etcd.member(2).status().get("leader", "0") == "0", what="no leader", every=0.05
    )
    started = time.monotonic()
    found = by_id(make_store(etcd.endpoints).check(deploy=True))
    assert time.monotonic() - started < CHECK_TIMEOUT + 1.5
    assert set(found) == {"django_locks.W302", "django_locks.W303"}  # no lease to grant: no W307
    assert "2 of the 3 etcd endpoints" in found["django_locks.W302"].msg
    no_leader = found["django_locks.W303"]
    assert "The etcd cluster has no leader" in no_leader.msg
    assert f"member m2 at {etcd.member(2).url}" in no_leader.msg
    assert (
        "etcdserver: no leader" in no_leader.msg and "a majority of its 3 members" in no_leader.msg
    )
    assert "Bring back a majority" in no_leader.hint


@pytest.mark.parametrize("how", ["killed", "paused"])
def test_a_stopped_cluster_is_one_warning_not_an_exception(etcd, healthy_ttl, how):
    for member in etcd.members:
        member.kill() if how == "killed" else member.pause()
    started = time.monotonic()
    [message] = make_store(etcd.endpoints, timeout="30s").check(deploy=True)
    # The endpoints are asked at once: three paused members cost one timeout, not three.
    assert time.monotonic() - started < CHECK_TIMEOUT + 1.5
    assert message.id == "django_locks.W301"
    assert "could not reach any member of the etcd cluster" in message.msg
    said = "could not be connected to" if how == "killed" else "did not answer within 2 s"
    assert message.msg.count(said) == 3
    assert "LOCKS['OPTIONS']['endpoints']" in message.hint


@pytest.mark.parametrize(
    ("ttl", "lives"), [("1s", 2), ("500ms", 2), ("2500ms", 3), ("2s", None), ("30s", None)]
)
def test_a_ttl_below_the_effective_ttl_is_said_with_what_etcd_does(etcd, ttl, lives):
    # The suite's members run --election-timeout 1000: a minimum lease TTL of 2 s.
    store = make_store(etcd.endpoints)
    with override_settings(LOCKS={"BACKEND": BACKEND, "TTL": ttl}):
        messages = [m for m in store.check(deploy=True) if m.id != "django_locks.W308"]
    assert store.effective_ttl_ms(1) == 2000  # learnt from the check's grant
    if lives is None:
        assert messages == []
        return
    [message] = messages
    assert message.id == "django_locks.W307"
    assert f"a lock lives {lives} s on etcd" in message.msg
    assert (
        "minimum lease TTL, 2 s here (about 1.5 x the members' --election-timeout)" in message.msg
    )
    assert f"takeover (P5) takes up to {lives} s" in message.msg
    assert f"Set LOCKS['TTL'] to at least '{lives}s'" in message.hint
    assert "--election-timeout" in message.hint


def test_the_checks_grant_leaves_no_lease_behind(etcd, healthy_ttl):
    client = etcd.member(0).client()

    def leases() -> set[str]:
        reply = client.post(client.get_url("lease/leases"), json={})
        return {lease["ID"] for lease in reply.get("leases", ())}

    before = leases()
    make_store(etcd.endpoints).check(deploy=True)
    assert leases() <= before  # the 2 s lease it was granted is revoked at once


def test_endpoints_naming_some_members_only(etcd, healthy_ttl):
    [message] = make_store(etcd.endpoints[:1]).check(deploy=True)
    assert message.id == "django_locks.W305"
    assert "lists 1 of the 3 members" in message.msg
    for member in etcd.members[1:]:
        assert f"{member.name} ({member.url})" in message.msg
        assert repr(member.url) in message.hint


@pytest.fixture
def lone_member() -> Iterator[Any]:
    """A cluster of one member, of its own (the suite's is three)."""
    from tests.servers.etcd import EtcdCluster

    cluster = EtcdCluster(size=1)
    try:
        yield cluster.start()
    finally:
        cluster.destroy()


def test_fewer_than_three_members_is_one_loss_from_stopping(lone_member, healthy_ttl):
    [message] = make_store(lone_member.endpoints).check(deploy=True)
    assert message.id == "django_locks.W304"
    assert "has 1 voting member: the loss of one member" in message.msg
    assert "stops the lock store" in message.msg
    assert "etcdctl member add" in message.hint


@pytest.mark.parametrize(
    ("version", "warned"),
    [("3.3.25", True), ("2.3.8", True), ("3.4.0", False), ("3.4.23", False), ("3.6.1", False)],
)
def test_etcd_below_3_4_is_unsupported(version, warned):
    # Only 3.4 is installed here: the version read from each member is checked by its rule.
    message = version_message("member m0 at http://10.0.0.1:2379", version)
    if not warned:
        assert message is None
        return
    assert message is not None
    assert message.id == "django_locks.W306"
    assert f"runs etcd {version}: EtcdStore needs etcd 3.4 or later" in message.msg
    assert "/v3/" in message.msg and "nested" in message.msg
    assert "Upgrade the members" in message.hint


def test_the_real_members_version_is_read(etcd):
    from django_locks.stores.etcd.checks import probe_all

    probes = probe_all(make_store(etcd.endpoints).endpoints)
    assert [probe.version for probe in probes] == ["3.4.23"] * 3
    assert version_message("x", probes[0].version) is None


@pytest.mark.parametrize(
    ("ttl", "warned"), [("1s", True), ("5s", True), ("6s", False), ("30s", False)]
)
def test_a_ttl_too_short_to_ride_out_an_election_is_said_with_the_shortest_that_does(
    etcd, ttl, warned
):
    store = make_store(etcd.endpoints)
    with override_settings(LOCKS={"BACKEND": BACKEND, "TTL": ttl}):
        found = [m for m in store.check(deploy=True) if m.id == "django_locks.W308"]
    assert bool(found) is warned
    if warned:
        assert "too short to ride out a leader election" in found[0].msg
        assert "at least '6s'" in found[0].hint


# Through manage.py check, as configured.


def run_check(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    call_command("check", "--tag", "django_locks", *args)
    captured = capsys.readouterr()
    return captured.out + captured.err


@pytest.mark.django_db
def test_manage_py_check_deploy_and_database_say_it_once(etcd, capsys):
    options = {"endpoints": etcd.endpoints, "prefix": "checks-cmd", "timeout": "5s"}
    with override_settings(LOCKS={"BACKEND": BACKEND, "OPTIONS": options, "TTL": "1s"}):
        assert "W307" not in run_check(capsys)  # no I/O without --deploy / --database
        for args in (
            ["--deploy"],
            ["--database", "default"],
            ["--deploy", "--database", "default"],
        ):
            out = run_check(capsys, *args)
            assert out.count("(django_locks.W307)") == 1, (args, out)
