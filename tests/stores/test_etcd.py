"""The etcd store's own behaviour on the suite's three-member cluster (tests/servers/etcd.py):
the effective ttl, renewals in two round trips answered per key by the watch, release notices,
failover between endpoints, and a leader's death. The contract is in test_contract.py."""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

import pytest

from django_locks import Locks
from django_locks.exceptions import StoreError, StoreTimeoutError
from django_locks.stores.base import PREEMPTED
from django_locks.stores.etcd import EtcdStore
from django_locks.stores.etcd.wire import Wire
from tests.waiting import eventually

pytestmark = [pytest.mark.etcd, pytest.mark.slow]


def make_store(endpoints: list[str], **options: Any) -> EtcdStore:
    return EtcdStore(endpoints=endpoints, prefix=f"t-{uuid.uuid4().hex[:8]}", **options)


class Counting:
    """Counts the calls of a store's Wire (each one HTTP round trip) by the thread that made
    this, by path (not the renewal thread's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        original = Wire.call
        mine = threading.get_ident()

        def call(wire: Wire, path: str, body: Any, deadline: float, **how: Any) -> Any:
            if threading.get_ident() == mine:
                self.calls.append(path)
            return original(wire, path, body, deadline, **how)

        monkeypatch.setattr(Wire, "call", call)


def test_the_effective_ttl_is_the_ttl_rounded_up_to_whole_seconds_and_the_cluster_minimum(
    etcd: Any,
) -> None:
    store = make_store(etcd.endpoints)
    assert store.acquire("k", "owner", 100) is not None  # the first grant tells the minimum
    assert store.effective_ttl_ms(100) == 2000  # 1.5 x the 1 s election timeout, rounded up
    assert store.effective_ttl_ms(2001) == 3000
    assert store.effective_ttl_ms(60_000) == 60_000
    info = store.lease("k")
    assert info is not None and info.expires_in is not None
    assert info.expires_in.total_seconds() <= 2
    # A lock's renewals and deadline follow the effective ttl, not the one asked for.
    with Locks(store, ttl=0.3).lock("lock") as lock:
        assert lock.ttl == 2.0
        time.sleep(2.5)  # past the effective ttl: renewed all along
        assert lock.held
        assert store.acquire("lock", "another", 1000) is None


def test_renew_many_of_a_thousand_locks_is_two_round_trips_and_answers_per_key(
    etcd: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(etcd.endpoints)
    other = make_store(etcd.endpoints)  # another process's view: its own watch
    other.prefix, other.layout = store.prefix, store.layout
    leases = [(f"k{i}", f"o{i}", 10_000) for i in range(1000)]
    for key, owner, ttl in leases:
        assert store.acquire(key, owner, ttl) is not None
    assert all(answer is True for answer in store.renew_many(leases))  # first: read
    assert other.force_release("k7")
    assert other.force_release("k9")
    taken = other.acquire("k7", "thief", 10_000)
    assert taken is not None
    counting = Counting(monkeypatch)
    answers = store.renew_many(leases)
    # The heartbeat's put (the watch has seen everything before it), then one keepalive.
    assert counting.calls == ["kv/txn", "lease/keepalive"], counting.calls
    assert answers[7] is False, "force-released, then taken by another owner"
    assert answers[9] is False, "force-released"
    assert [a for i, a in enumerate(answers) if i not in (7, 9)] == [True] * 998
    # A preempt request: answered at once, and the lease moved onto one of its own (one grant,
    # one Txn), so that the keepalive does not extend it.
    assert other.preempt("k8") is not None
    counting.calls.clear()
    answers = store.renew_many(leases)
    assert answers[8] == PREEMPTED
    assert counting.calls == ["kv/txn", "lease/grant", "kv/txn", "lease/keepalive"]
    assert store.renew("k8", "o8", 10_000) == PREEMPTED
    info = store.lease("k8")
    assert info is not None and info.expires_in is not None
    assert info.expires_in.total_seconds() <= 10


def test_an_acquire_soon_after_a_keepalive_is_one_txn_its_deadline_counted_from_it(
    etcd: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(etcd.endpoints)
    locks = Locks(store, ttl=6)
    first = locks.acquire("first")  # a new shared lease: granted, then one Txn
    assert first is not None
    time.sleep(0.5)
    counting = Counting(monkeypatch)
    sent = time.monotonic()
    second = locks.acquire("second")
    assert second is not None
    assert counting.calls == ["kv/txn"], counting.calls  # no keepalive: the lease has 5.5 s
    lag = store.acquired_lag("second", second._keeper.owner)
    assert 0.4 < lag < 2, lag  # within a renewal period (2 s) of the lease's last keepalive
    assert second._keeper.deadline < sent + 6 * 0.99 - lag + 0.05
    # The locks' renewals keep the lease alive every 2 s: no acquire needs a keepalive now.
    time.sleep(2.5)
    counting.calls.clear()
    third = locks.acquire("third")
    assert third is not None and 0 <= store.acquired_lag("third", third._keeper.owner) <= 2
    assert counting.calls == ["kv/txn"], counting.calls
    time.sleep(5)  # past every lock's ttl: renewed all along
    assert first.held and second.held and third.held
    for lock in (first, second, third):
        lock.release()


def test_a_key_force_released_by_another_process_is_refused_at_the_next_renewal(
    etcd: Any,
) -> None:
    store = make_store(etcd.endpoints)
    other = make_store(etcd.endpoints)
    other.prefix, other.layout = store.prefix, store.layout
    assert store.acquire("k", "mine", 5000) is not None
    assert store.renew("k", "mine", 5000) is True
    assert other.force_release("k")
    assert store.renew("k", "mine", 5000) is False
    assert other.acquire("k", "theirs", 5000) is not None
    assert store.renew("k", "mine", 5000) is False


def test_a_release_wakes_a_waiter_in_another_process_by_the_watch(etcd: Any) -> None:
    store = make_store(etcd.endpoints)
    assert store.acquire("k", "holder", 30_000) is not None
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a process of its own: its own watch
        try:
            woken = store.wait_for_release("k", 10)
            os.write(write, b"1" if woken else b"0")
        finally:
            os._exit(0)
    time.sleep(1.0)  # the child's watch is up
    released = time.monotonic()
    assert store.release("k", "holder")
    answer = os.read(read, 1)
    waited = time.monotonic() - released
    os.waitpid(child, 0)
    assert answer == b"1" and waited < 1.0, (answer, waited)


def _follower_first(etcd: Any) -> list[str]:
    """The cluster's endpoints, a follower's first (where a store's calls start)."""
    leader = etcd.wait_for_leader()
    follower = next(index for index in range(len(etcd.endpoints)) if index != leader)
    urls = list(etcd.endpoints)
    return [urls.pop(follower), *urls]


def test_calls_go_on_through_the_other_members_while_one_is_down(etcd: Any) -> None:
    # A follower, listed first (where calls start); the leader's death is the test below (a
    # write through a follower during the election is a StoreTimeoutError, retried).
    store = make_store(_follower_first(etcd), timeout=10)
    assert store.acquire("k", "owner", 10_000) is not None
    etcd.member(etcd.endpoints.index(store._urls()[0])).kill()
    assert store.renew("k", "owner", 10_000) is True
    assert store.release("k", "owner")
    assert store.acquire("k", "other", 10_000) is not None


def test_a_call_to_a_paused_member_times_out_and_the_next_goes_elsewhere(etcd: Any) -> None:
    store = make_store(_follower_first(etcd))
    token = store.acquire("k", "owner", 10_000)
    assert token is not None
    etcd.member(etcd.endpoints.index(store._urls()[0])).pause()  # a follower: no election
    with pytest.raises(StoreTimeoutError, match="did not answer"):
        store.renew("k", "owner", 10_000, timeout=0.5)
    assert store.acquire("k", "owner", 10_000, timeout=3) == token  # idempotent, elsewhere


def test_a_held_lock_keeps_its_key_and_token_through_a_leader_kill(etcd: Any) -> None:
    store = make_store(etcd.endpoints, timeout=1)
    token = store.acquire("k", "owner", 10_000)
    assert token is not None
    leader = etcd.wait_for_leader()
    killed = time.monotonic()
    etcd.member(leader).kill()

    def renewed() -> bool:
        try:
            return store.renew("k", "owner", 10_000) is True
        except StoreError:
            return False

    eventually(renewed, timeout=15, what="a renewal after the leader's death", every=0.1)
    served = time.monotonic() - killed
    assert store.acquire("k", "owner", 10_000) == token
    assert store.acquire("k", "another", 10_000) is None
    assert store.release("k", "owner")
    again = store.acquire("k", "another", 10_000)
    assert again is not None and again > token
    assert served < 10, served


def test_a_renewal_sent_as_the_leader_dies_is_answered_within_a_5_s_locks_time(
    etcd: Any,
) -> None:
    # The outsider's find: a renewal sent through a follower during the election waited for
    # etcd's 7 s request timeout, past a 5 or 10 s lock's deadline (6 of 8 and 2 of 5 lost).
    # Each attempt now waits POLICY.etcd_attempt (1 s), then goes to the next member.
    for _ in range(2):
        store = make_store(_follower_first(etcd), timeout=10)
        token = store.acquire("k", "owner", 5000)
        assert token is not None
        leader = etcd.wait_for_leader()
        etcd.member(leader).kill()
        sent = time.monotonic()
        # What a 5 s lock's keeper has at its first renewal: 5 x 2/3 s less its margin.
        assert store.renew("k", "owner", 5000, timeout=3.2) is True
        took = time.monotonic() - sent
        assert store.acquire("k", "another", 5000) is None
        assert took < 3.2, took
        etcd.member(leader).start()
        etcd.wait_for_leader()


def test_threads_racing_for_one_key_across_members_one_wins(etcd: Any) -> None:
    stores = [make_store([url]) for url in etcd.endpoints]
    for store in stores[1:]:
        store.prefix, store.layout = stores[0].prefix, stores[0].layout
    won: list[int] = []
    barrier = threading.Barrier(12)

    def race(index: int) -> None:
        barrier.wait()
        token = stores[index % 3].acquire("k", f"o{index}", 10_000)
        if token is not None:
            won.append(token)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1, won


def test_bad_options_are_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match=r"\['endpoints'\] must list at least one"):
        EtcdStore(endpoints=[])
    with pytest.raises(ValueError, match="http:// or https://"):
        EtcdStore(endpoints=["127.0.0.1:2379"])
    with pytest.raises(ValueError, match="http:// or https://"):
        EtcdStore(endpoints=[2379])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="`prefix`"):
        EtcdStore(prefix="")


def _taken_within(store: EtcdStore, key: str, seconds: float) -> float:
    """Seconds until another owner takes ``key`` (failing after ``seconds``)."""
    started = time.monotonic()
    while store.acquire(key, "the next holder", 2000) is None:
        assert time.monotonic() - started < seconds, f"{key!r} was never freed"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_garbage_collected_lock_lapses_while_the_process_renews_its_other_locks(
    etcd: Any,
) -> None:
    import gc

    store = make_store(etcd.endpoints)
    other = make_store(etcd.endpoints)
    other.prefix, other.layout = store.prefix, store.layout
    locks = Locks(store, ttl=2)
    kept = locks.acquire("kept")
    dropped = locks.acquire("dropped")
    assert kept is not None and dropped is not None
    del dropped
    gc.collect()
    # Without forsake() the keepalives of "kept" (same ttl, same etcd lease) renew it for ever.
    took = _taken_within(other, "dropped", 2 + 1.5)
    assert kept.held
    time.sleep(2.5)  # kept's renewals moved it onto a new shared lease: still held
    assert kept.held and other.acquire("kept", "the next holder", 2000) is None
    assert took < 3.5, took
    kept.release()


def test_a_lock_whose_release_failed_lapses_while_the_process_renews_its_other_locks(
    etcd: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(etcd.endpoints)
    other = make_store(etcd.endpoints)
    other.prefix, other.layout = store.prefix, store.layout
    locks = Locks(store, ttl=2)
    kept = locks.acquire("kept")
    failing = locks.acquire("failing")
    assert kept is not None and failing is not None
    original = Wire.call

    def refused(wire: Wire, path: str, body: Any, deadline: float, **how: Any) -> Any:
        if path == "kv/txn" and "request_delete_range" in str(body):
            raise StoreError("the release's answer was lost (injected)")
        return original(wire, path, body, deadline, **how)

    monkeypatch.setattr(Wire, "call", refused)
    with pytest.raises(StoreError, match="injected"):
        failing.release()
    monkeypatch.setattr(Wire, "call", original)
    took = _taken_within(other, "failing", 2 + 1.5)
    assert kept.held and other.acquire("kept", "the next holder", 2000) is None
    assert took < 3.5, took
    kept.release()


def test_an_https_endpoint_on_a_plain_http_member_is_a_store_error(etcd: Any) -> None:
    # The outsider's find: the TLS handshake's error reached etcd3gw with a str `reason`, and
    # the wire's look at its cause chain raised AttributeError.
    url = etcd.endpoints[0].replace("http://", "https://")
    with pytest.raises(StoreError, match="https://.*it serves plain http on this port"):
        make_store([url], timeout=2).acquire("k", "owner", 2000)


def test_a_quiet_prefix_logs_no_watch_failure(etcd: Any, caplog: pytest.LogCaptureFixture) -> None:
    # The watch remakes its stream after POLICY.etcd_watch_read (10 s) without a line: planned,
    # not a failure, so a quiet production prefix does not log a WARNING every 10 s.
    store = make_store(etcd.endpoints)
    with caplog.at_level("INFO", logger="django_locks"):
        assert store.wait_for_release("k", 12) is False  # nothing happens under the prefix
        assert store.acquire("k", "owner", 5000) is not None

        def release_soon() -> None:
            time.sleep(0.3)  # the waiter below waits first
            store.release("k", "owner")

        waiter = threading.Thread(target=release_soon)
        started = time.monotonic()
        waiter.start()
        woken = store.wait_for_release("k", 5)
        waiter.join()
    assert woken and time.monotonic() - started < 2, "the remade watch still wakes waiters"
    assert not [r for r in caplog.records if "watch" in r.getMessage()], caplog.text
