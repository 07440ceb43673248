"""``EtcdStore`` on a three-member cluster: ``python -m benchmarks --etcd`` (issue 28).

Starts the test suite's throwaway cluster (``tests/servers/etcd.py``: three ``/usr/bin/etcd``
members on loopback, each fsyncing its own write-ahead log) and measures, in one run:

* **acquire + release**: ``Locks(EtcdStore).acquire(key)`` + ``release()`` against the floor,
  two raw etcd transactions through the same client (the store's own ``etcd3gw`` client of this
  thread, ``Etcd3Client.post`` to ``kv/txn``, on the member the store talks to): a put if the key
  is absent, on a lease granted once, then a delete if the value is still ours. The floor's key
  is outside the store's prefix, so the store's watch pays nothing for it. Under it: the store's
  calls alone; the requests one such pair sent, captured at the store's wire and posted raw
  through the same client (the requests without the store's Python); the floor on a key the
  watch sees (what the watch costs a pair). Round-robin blocks, as the main run's latencies;
  median, p99, the client's CPU per pair, and the requests of one pair counted at the wire.
* **renewal**: 1,000 locks of one ttl held by one process; the round trips per renewal period
  COUNTED at the store's wire (``Wire.call`` of the store's process wrapped: every request the
  store sends but the watch's stream) and, independently, at the cluster (each member's
  ``grpc_server_started_total`` from ``/metrics``, summed: every request the members received);
  the watch's stream (re)opens counted too; the time of each ``renew_many``.
* **handoff**: 8 waiters in processes of their own (each its own store, so its own watch) and,
  for comparison, 8 threads of one process; each holder keeps the key 200 ms. Each handoff is
  classed by what ended its taker's last pause (``benchmarks/etcd_handoff.py``).

``--pinned``: this process (and the waiters' processes, which inherit it) on core 0, every
thread of the three members on core 1 (``sched_setaffinity``, what ``taskset -a -p`` does).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks import environment
from benchmarks.etcd_handoff import section_handoff
from benchmarks.measure import latencies, ratio, table, us

PREFIX = "bench"
RAW_PREFIX = b"bench-raw/"  # outside ``bench/``: the store's watch never sees it
LOCKS_HELD = 1000
RATIO_GOAL = 1.2
ROUND_TRIPS_GOAL = 2
NOTICE_GOAL = 0.9
FLOOR = "floor: 2 raw Txns (etcd3gw)"
FLOOR_WATCHED = "  the same, on a key the watch sees"
STORE_CALLS = "  its store calls alone"
REPLAYED = "  the store's requests, posted raw"


@dataclasses.dataclass(frozen=True)
class EtcdPlan:
    rounds: int = 10
    block: int = 100
    warmup: int = 20
    renewal_ttl: float = 6.0
    renewal_settle_periods: int = 3
    renewal_periods: int = 5
    handoffs: int = 150
    hold: float = 0.2


QUICK = EtcdPlan(
    rounds=2,
    block=10,
    warmup=3,
    renewal_ttl=3.0,
    renewal_settle_periods=2,
    renewal_periods=2,
    handoffs=6,
    hold=0.05,
)


def say(text: str = "") -> None:
    print(text, flush=True)


# The cluster.


@contextlib.contextmanager
def cluster() -> Iterator[Any]:
    """The test suite's three-member cluster, started for the run and destroyed after it."""
    from tests.servers import find_binary

    if find_binary("etcd", "/usr/bin/etcd", "/usr/local/bin/etcd") is None:
        raise environment.Unavailable("etcd not found (apt-get install etcd-server)")
    try:
        import etcd3gw  # noqa: F401
    except ImportError:
        raise environment.Unavailable("etcd3gw is not installed (pip install -e .[etcd])") from None
    from tests.servers.etcd import ELECTION_MS, HEARTBEAT_MS, EtcdCluster

    started = EtcdCluster()
    try:
        started.start()
        say(
            f"== etcd: a three-member cluster on loopback (heartbeat {HEARTBEAT_MS} ms, election "
            f"timeout {ELECTION_MS} ms; {version(started)}) =="
        )
        say()
        yield started
    finally:
        # The run's stores keep their watches to the end of the process: quiet their warning
        # that the cluster went away.
        logging.getLogger("django_locks").disabled = True
        started.destroy()


def version(cluster: Any) -> str:
    with urllib.request.urlopen(f"{cluster.endpoints[0]}/version", timeout=5) as response:
        return f"etcd {json.loads(response.read())['etcdserver']}"


STARTED = re.compile(r'^grpc_server_started_total\{.*grpc_method="(\w+)".*\} (\d+)', re.M)


def received(cluster: Any) -> collections.Counter[str]:
    """Requests the members' gRPC servers started, per method, summed over the members (the
    gateway's JSON requests included: each becomes one call on its member's gRPC server)."""
    counts: collections.Counter[str] = collections.Counter()
    for url in cluster.endpoints:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            text = response.read().decode()
        for method, count in STARTED.findall(text):
            counts[method] += int(count)
    return counts


def the_store(cluster: Any) -> Any:
    from django_locks.stores.etcd import EtcdStore

    return EtcdStore(endpoints=cluster.endpoints, prefix=PREFIX)


def member_role(cluster: Any, store: Any) -> str:
    wire = store._process.get().wire
    index = wire.preferred
    return f"m{index} ({'the leader' if cluster.leader() == index else 'a follower'})"


# Acquire + release.


def raw_pair(client: Any, lease: int, key: bytes) -> Callable[[], None]:
    """Two raw Txns: put ``key`` on ``lease`` if absent, then delete it if it is still ours."""
    from django_locks.stores.etcd.wire import b64

    url = client.get_url("kv/txn")
    name, value = b64(key), b64(uuid.uuid4().hex.encode())
    take = {
        "compare": [{"target": "CREATE", "key": name, "create_revision": "0", "result": "EQUAL"}],
        "success": [{"request_put": {"key": name, "value": value, "lease": str(lease)}}],
    }
    free = {
        "compare": [{"target": "VALUE", "key": name, "value": value, "result": "EQUAL"}],
        "success": [{"request_delete_range": {"key": name}}],
    }

    def pair() -> None:
        if not client.post(url, json=take).get("succeeded"):
            raise RuntimeError(f"{key!r} was taken")
        if not client.post(url, json=free).get("succeeded"):
            raise RuntimeError(f"{key!r} was not ours")

    return pair


def lock_pair(locks: Any, key: str) -> Callable[[], None]:
    def pair() -> None:
        lock = locks.acquire(key)
        if lock is None:
            raise RuntimeError(f"{key!r} was taken")
        lock.release()

    return pair


def store_pair(store: Any, key: str) -> Callable[[], None]:
    from django_locks.holders import this_process
    from django_locks.owners import new_owner

    holder = this_process()

    def pair() -> None:
        owner = new_owner()
        if not isinstance(store.acquire_as(key, owner, 30_000, holder), int):
            raise RuntimeError(f"{key!r} was taken")
        store.end(key, owner, "released")

    return pair


def captured(store: Any, pair: Callable[[], None]) -> list[tuple[str, Any]]:
    """The requests (path, body) the store's wire sends for one call of ``pair``."""
    wire = store._process.get().wire
    call, sent = wire.call, []

    def capture(path: str, body: Any, deadline: float, **how: Any) -> Any:
        sent.append((path, body))
        return call(path, body, deadline, **how)

    wire.call = capture
    try:
        pair()
    finally:
        del wire.call  # the class's method again
    return sent


def replayed_pair(store: Any, client: Any, lease: int, key: str) -> Callable[[], None]:
    """The requests the store sends for one ``acquire_as`` + ``end`` of ``key`` (captured at its
    wire once: a keepalive of the shared lease and two Txns), posted raw through ``client`` in
    the same order, on ``lease`` instead: the requests without the store's Python."""
    requests = []
    for path, body in captured(store, store_pair(store, key)):
        if path == "lease/keepalive":
            body = {"ID": str(lease)}
        elif path == "kv/txn":
            body = json.loads(re.sub(r'"lease": "\d+"', f'"lease": "{lease}"', json.dumps(body)))
        else:
            raise RuntimeError(f"a store pair sent {path}: not replayed")
        requests.append((client.get_url(path), path, body))

    def pair() -> None:
        for url, path, body in requests:
            reply = client.post(url, json=body)
            if path == "kv/txn" and not reply.get("succeeded"):
                raise RuntimeError(f"a replayed Txn of {key!r} failed")

    return pair


def requests_shown(paths: list[str]) -> str:
    names = {"kv/txn": "Txn", "lease/keepalive": "keepalive", "lease/grant": "grant"}
    counts = collections.Counter(names.get(path, path) for path in paths)
    return " + ".join(f"{n} {name}{'s' if n > 1 else ''}" for name, n in counts.items())


def section_latency(cluster: Any, plan: EtcdPlan) -> dict[str, Any]:
    from django_locks import Locks

    store = the_store(cluster)
    locks = Locks(store)
    lock_pair(locks, "bench:latency:warm")()  # the shared lease granted, the watch started
    wire = store._process.get().wire
    client = wire.client(wire.preferred)  # the store's own client of this thread
    lease = int(client.post(client.get_url("lease/grant"), json={"TTL": 600, "ID": 0})["ID"])
    operations = {
        FLOOR: raw_pair(client, lease, RAW_PREFIX + b"latency"),
        "django_locks": lock_pair(locks, "bench:latency:locks"),
        STORE_CALLS: store_pair(store, "bench:latency:store"),
        REPLAYED: replayed_pair(store, client, lease, "bench:latency:replayed"),
        FLOOR_WATCHED: raw_pair(client, lease, f"{PREFIX}/raw/latency".encode()),
    }
    sent = {
        name: [path for path, _ in captured(store, operations[name])]
        for name in ("django_locks", STORE_CALLS)
    }
    timed = latencies(operations, rounds=plan.rounds, block=plan.block, warmup=plan.warmup)
    role = member_role(cluster, store)
    client.post(client.get_url("lease/revoke"), json={"ID": str(lease)})
    base = timed[FLOOR]
    sent[FLOOR] = sent[FLOOR_WATCHED] = ["kv/txn", "kv/txn"]
    sent[REPLAYED] = sent[STORE_CALLS]
    rows, figures = [], {}
    for name, value in timed.items():
        rows.append(
            [
                name,
                us(value.median),
                us(value.p99),
                ratio(value.median, base.median),
                ratio(value.p99, base.p99),
                us(value.cpu),
                requests_shown(sent[name]),
            ]
        )
        figures[name.strip()] = {
            **value.as_dict(),
            "ratio": round(value.median / base.median, 3),
            "requests": sent[name],
        }
    say(
        f"Uncontended acquire + release, one thread, through {role} ({plan.rounds} rounds of "
        f"{plan.block}; ratios to the floor's median / p99; client CPU per pair, every thread's):"
    )
    say(table(["", "median", "p99", "x floor", "p99 x floor", "client CPU", "requests"], rows))
    say(
        "  (the floor: a Txn putting the key on a lease granted once if it is absent, then a\n"
        "   Txn deleting it if its value is still ours, through the store's own etcd3gw client\n"
        "   of this thread, on a key outside the store's prefix. Under it: the requests of one\n"
        "   acquire_as + end captured at the store's wire, posted as they are through that\n"
        "   client; and the floor on a key under the prefix, whose events the store's watch\n"
        "   receives and decodes. Requests: what one pair sent, counted at the store's wire.)"
    )
    say()
    return {"member": role, "pairs": figures}


# 1,000 held locks.


class WireCounter:
    """Counts every request the store sends from this process: an instance attribute over its
    ``Wire.call`` (per path and per thread), and the watch's stream (re)opens (over
    ``Watch._stream``). Nothing else about the store changes."""

    def __init__(self, store: Any) -> None:
        process = store._process.get()
        self._mutex = threading.Lock()
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self.streams = 0
        call, stream = process.wire.call, process.watch._stream

        def counted_call(path: str, body: Any, deadline: float, **how: Any) -> Any:
            with self._mutex:
                self.calls[path, threading.current_thread().name] += 1
            return call(path, body, deadline, **how)

        def counted_stream() -> None:
            with self._mutex:
                self.streams += 1
            stream()

        process.wire.call = counted_call
        process.watch._stream = counted_stream

    def reset(self) -> None:
        with self._mutex:
            self.calls.clear()
            self.streams = 0

    def of_thread(self) -> int:
        """The requests this thread sent so far."""
        name = threading.current_thread().name
        with self._mutex:
            return sum(count for (_, thread), count in self.calls.items() if thread == name)

    def by_path(self) -> dict[str, int]:
        with self._mutex:
            found: collections.Counter[str] = collections.Counter()
            for (path, _), count in self.calls.items():
                found[path] += count
            return dict(found)


def section_renewal(cluster: Any, plan: EtcdPlan) -> dict[str, Any]:
    from django_locks import Locks

    store = the_store(cluster)
    counter = WireCounter(store)
    # (started at, locks, seconds, requests sent) of each renew_many
    batches: list[tuple[float, int, float, int]] = []
    renew_many = store.renew_many

    def timed(leases: Any, *, timeout: float | None = None) -> Any:
        began, sent = time.perf_counter(), counter.of_thread()
        try:
            return renew_many(leases, timeout=timeout)
        finally:
            took = time.perf_counter() - began
            batches.append((began, len(leases), took, counter.of_thread() - sent))

    store.renew_many = timed
    locks = Locks(store, ttl=plan.renewal_ttl)
    period = plan.renewal_ttl / 3
    started = time.perf_counter()
    held = []
    for index in range(LOCKS_HELD):
        lock = locks.acquire(f"bench:renewal:{index}")
        if lock is None:
            raise RuntimeError("a renewal benchmark key was taken")
        held.append(lock)
    acquired_in = time.perf_counter() - started
    time.sleep(period * plan.renewal_settle_periods)
    counter.reset()
    before = received(cluster)
    window = time.perf_counter()
    time.sleep(period * plan.renewal_periods)
    ended = time.perf_counter()
    after = received(cluster)
    sent = counter.by_path()
    streams = counter.streams
    time.sleep(min(period / 2, 1.0))  # a renew_many started in the window answers meanwhile
    rounds = [
        (n, took, requests) for began, n, took, requests in batches if window <= began < ended
    ]
    lost = sum(not lock.held for lock in held)
    for lock in held:
        lock.release()
    at_cluster = {m: after[m] - before[m] for m in after if after[m] - before[m]}
    trips = sum(requests for _, _, requests in rounds)
    seconds = sorted(s for _, s, _ in rounds)
    each = collections.Counter(n for _, _, n in rounds)
    figures = {
        "locks": LOCKS_HELD,
        "ttl_s": plan.renewal_ttl,
        "periods": plan.renewal_periods,
        "acquired_in_s": round(acquired_in, 2),
        "requests": sent,  # everything sent in the window
        "round_trips": trips,  # by the renew_many calls started in the window
        "round_trips_per_period": trips / plan.renewal_periods,
        "round_trips_per_renew_many": {str(n): count for n, count in sorted(each.items())},
        "at_cluster": at_cluster,
        "at_cluster_per_period": sum(at_cluster.values()) / plan.renewal_periods,
        "watch_streams_opened": streams,
        "renew_many_calls": len(rounds),
        "leases_renewed_per_period": sum(n for n, _, _ in rounds) / plan.renewal_periods,
        "renew_many_median_ms": round(seconds[len(seconds) // 2] * 1e3, 2) if seconds else None,
        "renew_many_max_ms": round(seconds[-1] * 1e3, 2) if seconds else None,
        "lost": lost,
    }
    shape = ", ".join(f"{count} x {n}" for n, count in sorted(each.items())) + " round trips"
    say(
        f"Renewal: {LOCKS_HELD:,} locks held by one process (ttl {plan.renewal_ttl:g}s, renewed "
        f"every {period:g}s; acquired in {acquired_in:.1f}s), counted over "
        f"{plan.renewal_periods} periods after {plan.renewal_settle_periods} to settle:"
    )
    say(
        table(
            [
                "round trips / period",
                "at the cluster / period",
                "renew_many calls",
                "locks renewed / period",
                "one renew_many (median, max)",
                "lost",
            ],
            [
                [
                    f"{figures['round_trips_per_period']:g}",
                    f"{figures['at_cluster_per_period']:g}",
                    f"{len(rounds)} ({shape if rounds else '-'})",
                    f"{figures['leases_renewed_per_period']:g}",
                    f"{figures['renew_many_median_ms']} ms, {figures['renew_many_max_ms']} ms",
                    str(lost),
                ]
            ],
        )
    )
    shown = ", ".join(f"{path} {count}" for path, count in sorted(sent.items())) or "none"
    cluster_shown = ", ".join(f"{m} {c}" for m, c in sorted(at_cluster.items())) or "none"
    say(
        "  (round trips: the requests of the renew_many calls started in the window, counted\n"
        f"   at the store's Wire.call on their thread; everything the store sent in the window:\n"
        f"   {shown}; received by the members (grpc_server_started_total, summed):\n"
        f"   {cluster_shown}; the watch's stream opened {streams} times)"
    )
    say()
    return figures


# The run.


def verdicts(results: dict[str, Any]) -> list[dict[str, Any]]:
    pair = results["latency"]["pairs"]["django_locks"]
    renewal = results["renewal"]
    handoff = results["handoff"]["processes"]
    return [
        {
            "goal": f"acquire+release <= {RATIO_GOAL}x two raw Txns",
            "measured": f"{pair['ratio']:.2f}x ({pair['median_us']:g} us)",
            "met": pair["ratio"] <= RATIO_GOAL,
        },
        {
            "goal": f"1,000 held locks: <= {ROUND_TRIPS_GOAL} round trips per period",
            "measured": (
                f"{renewal['round_trips_per_period']:g} counted at the store, "
                f"{renewal['at_cluster_per_period']:g} at the cluster (lost {renewal['lost']})"
            ),
            "met": renewal["round_trips_per_period"] <= ROUND_TRIPS_GOAL and not renewal["lost"],
        },
        {
            "goal": f"handoff, 8 processes: >= {NOTICE_GOAL:.0%} woken by a watch event",
            "measured": (
                f"{handoff['notice_share']:.1%} of {handoff['handoffs']} "
                f"({handoff['latency']['median_us']:g} us)"
            ),
            "met": handoff["notice_share"] >= NOTICE_GOAL,
        },
    ]


def main(*, quick: bool, stores: set[str] | None = None, pinned: bool = False) -> dict[str, Any]:
    """Every section on one cluster started for the run; the figures and the verdicts."""
    plan = QUICK if quick else EtcdPlan()
    results: dict[str, Any] = {}
    environment.configure_django(None)
    with cluster() as started:
        placement = environment.Placement({"etcd": started})
        if pinned:
            if not placement.possible:
                raise environment.Unavailable("--pinned needs two cores")
            placement.pin()
        try:
            results["latency"] = section_latency(started, plan)
            results["renewal"] = section_renewal(started, plan)
            results["handoff"] = {
                mode: section_handoff(
                    started.endpoints,
                    PREFIX,
                    processes=mode == "processes",
                    handoffs=plan.handoffs,
                    hold=plan.hold,
                )
                for mode in ("processes", "threads")
            }
        finally:
            if pinned:
                placement.unpin()
    results["goals"] = verdicts(results)
    say("== Against the goals of issue 28 ==")
    say(
        table(
            ["goal", "measured", ""],
            [[v["goal"], v["measured"], "met" if v["met"] else "MISSED"] for v in results["goals"]],
            left=2,
        )
    )
    return results
