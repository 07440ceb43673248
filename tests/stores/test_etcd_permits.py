"""EtcdStore's permits on the suite's three-member cluster, beyond the contract (test_contract.py):
racing processes, the round trips each operation costs, and where the key's own record lives
(django_locks/stores/etcd/permit_ops.py) when the process whose lease carries it dies."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import IO, Any

import pytest

from django_locks.exceptions import PermitsMismatchError
from django_locks.holders import Holder
from django_locks.stores.base import PERMITS_OWNER, PermitGrant, Slot
from django_locks.stores.etcd import EtcdStore
from django_locks.stores.etcd import wire as ops
from tests.children.env import ROOT, child_env
from tests.stores.test_etcd import Counting
from tests.waiting import eventually

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

WORKER = Holder(host="web-2", pid=4121, kind="worker", detail="task-1")


def _owner() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def store(etcd: Any) -> Iterator[EtcdStore]:
    store = EtcdStore(endpoints=etcd.endpoints, prefix=f"t-{uuid.uuid4().hex[:8]}")
    yield store
    store.clear()
    store.close()


class Child:
    """A ``tests.children.etcd_permits`` process: its output lines as they come."""

    def __init__(self, store: EtcdStore, *args: object) -> None:
        endpoints = ",".join(store._urls())
        command = [sys.executable, "-m", "tests.children.etcd_permits", str(args[0]), endpoints,
                   store.prefix, *map(str, args[1:])]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            env=child_env(settings="tests.settings"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        assert self.process.stdout is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, word: str, timeout: float = 30) -> str:
        eventually(
            lambda: any(line.startswith(word) for line in self.lines) or self.process.poll(),
            timeout=timeout,
            what=lambda: f"{word!r} from the child; it said {self.lines}",
        )
        assert self.process.poll() is None or any(line.startswith(word) for line in self.lines)
        return next(line for line in self.lines if line.startswith(word))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.stop()


def _lease_of(store: EtcdStore, key: str) -> int | None:
    """The etcd lease the lease key of ``key`` is on (``None``: no such key)."""
    get = ops.get(store.layout.names(key).lease)
    reply = store._txn({"compare": [], "success": [get]}, store._deadline(None))
    found = ops.kvs(reply["responses"][0])
    return int(found[0].get("lease", 0)) if found else None


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = live = 0
    for _, step in events:  # at one instant an end (-1) sorts before a start
        live += step
        most = max(most, live)
    return most


def test_32_threads_in_2_processes_racing_for_3_permits_never_hold_4(
    store: EtcdStore, children: list[Child]
) -> None:
    children += [Child(store, "race", "k", 3, 16, 6) for _ in range(2)]
    for child in children:
        child.wait_for("done", timeout=120)
        done = time.monotonic()
        assert child.process.wait(30) == 0
        print(f"exited {time.monotonic() - done:.2f} s after done")
    held = [line.split() for child in children for line in child.lines if line.startswith("held")]
    assert len(held) == 2 * 16 * 6
    spans = [(float(start), float(end)) for _, start, end, _, _ in held]
    # Each span lies inside the time its slot was held (after the grant, before the release).
    assert _most_at_once(spans) == 3, "3 at once at most, and the race did reach 3"
    tokens = [int(token) for _, _, _, token, _ in held]
    assert len(set(tokens)) == len(tokens), "every grant a token of its own"
    for permit in ("1", "2", "3"):  # one slot, one holder at a time, its tokens growing
        mine = sorted((float(s), float(e), int(t)) for _, s, e, t, p in held if p == permit)
        assert all(a[1] <= b[0] and a[2] < b[2] for a, b in itertools.pairwise(mine)), permit
    assert {p for *_, p in held} == {"1", "2", "3"}
    assert store.lease("k") is None, "every slot released: the record went with the last"
    assert isinstance(store.acquire("k", _owner(), 60_000), int)


def test_the_round_trips_of_permits(store: EtcdStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.acquire("warm", _owner(), 60_000)  # the shared lease granted: not counted below
    counting = Counting(monkeypatch)
    first, second = _owner(), _owner()
    one = store.acquire_permit("k", first, 60_000, 2, WORKER)
    # The shared lease was granted a moment ago (within a renewal period): no keepalive, the
    # slots' deadlines count from the grant (EtcdStore.acquired_lag).
    keep: list[str] = []
    assert isinstance(one, PermitGrant) and counting.calls == ["kv/txn", *keep], "ONE Txn"
    del counting.calls[:]
    two = store.acquire_permit("k", second, 60_000, 2, WORKER)
    assert isinstance(two, PermitGrant) and counting.calls == ["kv/txn", "kv/txn", *keep]
    del counting.calls[:]
    assert store.acquire_permit("k", second, 60_000, 2, WORKER) == two  # the same owner
    assert counting.calls == ["kv/txn", "kv/txn", *keep]
    del counting.calls[:]
    full = store.acquire_permit("k", _owner(), 60_000, 2, WORKER)
    assert isinstance(full, Holder), full
    assert counting.calls == ["kv/txn"], "the read says it is full; its expiry known here"
    del counting.calls[:]
    slots = [(Slot("k", one.permit), first, 60_000), (Slot("k", two.permit), second, 60_000)]
    assert store.renew_many(slots) == [True, True]
    assert counting.calls == ["kv/txn", "lease/keepalive"], "a heartbeat Txn, one keepalive"
    del counting.calls[:]
    assert store.release(Slot("k", one.permit), first)
    assert store.release(Slot("k", two.permit), second)
    assert counting.calls == ["kv/txn"] * 2, "each release ONE Txn, the record with the last"
    assert store.lease("k") is None


def test_a_released_slot_hands_the_record_to_the_live_slot_whose_lease_ends_latest(
    store: EtcdStore, children: list[Child]
) -> None:
    """The record on this process's lease, which it keeps alive for another lock; the slot
    there released while a dead process's slot lives on: the record goes onto that slot's
    lease, and ends with it (it would live as long as the other lock, left where it was)."""
    child = Child(store, "hold", "k", 3, 3000)
    children.append(child)
    _, _, theirs = child.wait_for("granted").split()
    their_lease = _lease_of(store, f"k#{theirs}")
    mine, other = _owner(), _owner()
    grant = store.acquire_permit("k", mine, 3000, 3, WORKER)
    assert isinstance(grant, PermitGrant)
    assert store.acquire("other", other, 3000) is not None
    my_lease = _lease_of(store, "other")
    assert _lease_of(store, f"k#{grant.permit}") == my_lease
    assert _lease_of(store, "k") == my_lease, "taken last, on a lease as long: the record's"
    stop = threading.Event()

    def renew_other() -> None:
        while not stop.wait(0.5):
            assert store.renew("other", other, 3000) is True

    renewer = threading.Thread(target=renew_other)
    renewer.start()
    try:
        child.stop()  # SIGKILL: its slot lives until its lease expires (3 s at most)
        assert store.release(Slot("k", grant.permit), mine)
        assert _lease_of(store, "k") == their_lease, "the record follows the live slot"
        with pytest.raises(PermitsMismatchError):
            store.acquire("k", _owner(), 60_000)
        took = eventually(
            lambda: store.acquire("k", _owner(), 60_000) is not None,
            timeout=6,
            ignoring=(PermitsMismatchError,),
            what="the record ending with the dead process's slot",
        )
        assert took < 4
        assert _lease_of(store, f"k#{theirs}") is None
    finally:
        stop.set()
        renewer.join()


def test_a_record_lost_with_a_longer_slot_s_lease_is_put_back_by_the_next_renewal(
    store: EtcdStore, children: list[Child]
) -> None:
    """Slots of two ttls: the record stays on the longer lease (a shorter one could end before
    it). When that lease's process dies, the record ends with its slot, and the other slot's
    next renewal puts it back: the key is without its record that long at most."""
    child = Child(store, "hold", "k", 3, 6000)
    children.append(child)
    _, _, theirs = child.wait_for("granted").split()
    their_lease = _lease_of(store, f"k#{theirs}")
    mine = _owner()
    grant = store.acquire_permit("k", mine, 2000, 3, WORKER)
    assert isinstance(grant, PermitGrant)
    assert _lease_of(store, "k") == their_lease, "6 s beats 2 s: the record stays"
    slot, answers, stop = Slot("k", grant.permit), [], threading.Event()

    def renew() -> None:
        while not stop.wait(0.5):
            answers.append(store.renew(slot, mine, 2000))

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        child.stop()
        eventually(lambda: _lease_of(store, f"k#{theirs}") is None, timeout=8, every=0.01)
        gone = time.monotonic()
        eventually(
            lambda: (info := store.lease("k")) is not None and info.owner == PERMITS_OWNER,
            timeout=1.5,
            every=0.01,
            what="the record put back by a renewal",
        )
        print(f"the record was missing {time.monotonic() - gone:.3f} s")
        assert _lease_of(store, "k") == _lease_of(store, str(slot))
        with pytest.raises(PermitsMismatchError):
            store.acquire("k", _owner(), 60_000)
    finally:
        stop.set()
        renewer.join()
    assert answers and all(answer is True for answer in answers), answers
