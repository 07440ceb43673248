"""One fault run: servers, worker processes, a nemesis injecting one kind of fault every ~10 s
(with jitter; tests/faults/nemesis.py), then the checker on the recorded history.

``run(RunConfig(scenario=..., store=..., duration=..., seed=...))`` returns the checker's
``Report``; its ``summary()`` is the run's one line. The run's directory keeps every history file
(``worker-N.jsonl``, ``nemesis.jsonl``), the workers' logs and ``report.json``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.children.env import child_env
from tests.faults.checker import Report, check, read_history
from tests.faults.etcd_faults import (
    ELECTION_S,
    ETCD_GENERIC,
    ETCD_SCENARIOS,
    ETCD_TTL,
    EtcdFaults,
    etcd_routes,
    etcd_spec,
    start_etcd,
)
from tests.faults.nemesis import LEADER_KEY, Tracker
from tests.faults.pg_faults import STANDBY_SCENARIOS, STANDBY_TTL, StandbyFaults
from tests.faults.proxy import Proxy
from tests.faults.redis_faults import SENTINEL_SCENARIOS, SENTINEL_TTL, SentinelFaults
from tests.faults.servers import ROOT, Servers, start_redis
from tests.faults.worker import History
from tests.servers.etcd import EtcdCluster
from tests.servers.pg_standby import StandbyPair
from tests.servers.redis_sentinel import SentinelServers

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"

SCENARIOS: dict[str, str] = {
    "baseline": "contention only, no fault",
    "holder_pause": "a holder SIGSTOPped for 0.5 to 3 ttl",
    "request_pause": "a holder's next acquire/renew is served but its answer comes 0.5-3 ttl late",
    "store_pause": "the store's processes SIGSTOPped for 0.5 to 3 ttl",
    "hung_connection": "a holder's store connections hang 0.5 to 3 ttl (proxy, no reset)",
    "store_restart": "the store killed and restarted (Redis kill -9, appendfsync always; "
    "PostgreSQL immediate shutdown)",
    "store_restart_everysec": "Redis kill -9 and restart with appendfsync everysec",
    "delayed_write": "a holder's writes reach the database 1.5-3 ttl late, after its release",
    "wallclock": "a holder's wall clock jumps by hours (libfaketime, that process only)",
    "atomic_pgbouncer": "locks taken inside rolled-back atomic() blocks, the store through "
    "PgBouncer (transaction mode), holders paused",
    "holder_kill": "a holder SIGKILLed (a replacement worker starts)",
    "leader": "run_leader processes: the leader SIGKILLed or SIGSTOPped, fenced leader writes",
    "permits": "8 workers on one key with permits=3: one to three holders paused, killed or "
    "their connections hung at once, in turn",
    "replace": "rounds that find their key taken preempt its holder and wait for it (half of "
    "them); holders paused, killed, their connections hung or a stale request written, in turn",
    "max_hold": "4 workers on one key with max_hold=1.5s: jobs that hang past their lease or work "
    "until the signal aborts",
    **ETCD_SCENARIOS,
    **SENTINEL_SCENARIOS,
    **STANDBY_SCENARIOS,
}
STORES = ("postgres", "redis", "sqlite", "etcd")
SQLITE_SCENARIOS = ("baseline", "holder_pause", "request_pause", "holder_kill")
"""Where the SQLite store applies: no server to pause, restart or cut off (a file on this
machine); not ``delayed_write`` (an atomic block held open 1.5 to 3 ttl stops every writer of the
file: what the docs tell users not to do), nor ``wallclock`` (SQLite's "now" is each process's
wall clock)."""
ONLY: dict[str, tuple[str, ...]] = {
    **{name: ("postgres", "redis") for name in SCENARIOS if name not in SQLITE_SCENARIOS},
    **{name: ("postgres", "redis", "sqlite") for name in SQLITE_SCENARIOS},
    # After the comprehensions, which would otherwise override them (before 2026-12-03 they did:
    # the matrix ran these two on both stores).
    "store_restart_everysec": ("redis",),
    "atomic_pgbouncer": ("postgres",),
    **{name: ("etcd",) for name in ETCD_SCENARIOS},
    **{name: ("redis",) for name in SENTINEL_SCENARIOS},
    **{name: ("postgres",) for name in STANDBY_SCENARIOS},
}
for _name in ETCD_GENERIC:
    ONLY[_name] += ("etcd",)
"""The stores each scenario runs on."""
ATOMIC_CANARY = {"postgres": 1.0, "sqlite": 0.5}
"""The share of rounds with the atomic canary, on the stores where ``lock.atomic()`` applies
(tests/faults/atomic_canary.py). On SQLite half: a holder paused inside its block stops every
writer of the file, the competitor's acquire included, so only the other rounds show what the
plain canary loses."""
NO_ATOMIC_CANARY = ("permits", "replace", "max_hold", "leader", *STANDBY_SCENARIOS)
"""Scenarios whose rounds have no atomic canary (permits refuse ``lock.atomic()``; the standby
scenarios' leases are in a database of their own, the canary's rows in the suite's)."""
SQLITE_SECTION = 0.25
"""On SQLite, critical sections (and so atomic blocks) last up to this many ttl: "well under
ttl/3", as the docs ask of blocks that hold the file's write lock."""
CI_SCENARIOS = ("baseline", "holder_pause", "hung_connection", "delayed_write")
CI_ETCD_SCENARIOS = ("etcd_leader_kill", "etcd_hung_route")
EXPECTED_TO_FAIL = {
    ("redis", "store_restart_everysec"),
    ("redis", "sentinel_failover"),
    ("postgres", "pg_failover_async"),
}
"""Runs reported but not failed on their violations: losing the last second of writes is what
``appendfsync everysec`` documents, and losing what the replica had not received is what
asynchronous replication does (tests/faults/redis_faults.py, tests/faults/pg_faults.py)."""


def stores_of(scenario: str) -> tuple[str, ...]:
    return ONLY.get(scenario, STORES)


LONG_SECTIONS = {
    "hung_connection": 3,
    "store_pause": 3,
    "permits": 2,
    "replace": 2,
    **{name: 3 for name in ETCD_SCENARIOS},
    **{name: 2 for name in SENTINEL_SCENARIOS},
    **{name: 2 for name in STANDBY_SCENARIOS},
}
"""A critical section of at most a ttl ends before the deadline of its lease (0.99 ttl after the
last renewal sent), so a store that stops answering would never cost a lock: under these faults
sections last up to this many ttl, so that the loss, and how late it is announced, is
measured."""
TTL = {
    "etcd": ETCD_TTL,
    **{name: SENTINEL_TTL for name in SENTINEL_SCENARIOS},
    **{name: STANDBY_TTL for name in STANDBY_SCENARIOS},
}
"""The run's ttl by store or scenario, when not 2 s (tests/faults/etcd_faults.py says why 3 s on
etcd, tests/faults/redis_faults.py why 6 s through a Sentinel failover, as through a standby's
promotion)."""
DEFAULTS: dict[str, Any] = {"workers": 6, "keys": 3, "permits": 1, "interval": 10.0}
OWN_DEFAULTS: dict[str, dict[str, Any]] = {
    # One key, so that all 8 workers contend for its 3 permits; a fault every ~7 s, so that each
    # of the three kinds strikes about three times in 60 s.
    "permits": {"workers": 8, "keys": 1, "permits": 3, "interval": 7.0},
    # Two keys for six workers: most rounds find their key taken. A fault every ~5 s: each of
    # the four kinds strikes about three times in 60 s.
    "replace": {"keys": 2, "interval": 5.0},
    # One key, so that a capped lease always has waiters (their waits outlast max_hold + ttl).
    "max_hold": {"workers": 4, "keys": 1, "max_hold": 1.5},
}
"""What a RunConfig field left at 0 means, by scenario."""


@dataclass
class RunConfig:
    scenario: str
    store: str
    duration: float = 30.0
    seed: int = 1
    workers: int = 0  # 0: the scenario's (DEFAULTS, OWN_DEFAULTS), as for the next three
    keys: int = 0
    permits: int = 0  # 1: plain locks
    ttl: float = 0.0  # seconds; 0: the store's (TTL), else 2
    cs_max: float | None = None  # seconds; a ttl, or LONG_SECTIONS' ttl multiple
    interval: float = 0.0
    max_hold: float = 0.0  # seconds; 0: none (the max_hold scenario's own)
    out: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}: one of {', '.join(SCENARIOS)}")
        if self.store not in STORES:
            raise ValueError(f"`store` must be one of {', '.join(STORES)}, got {self.store!r}")
        if self.store not in stores_of(self.scenario):
            raise ValueError(f"{self.scenario} runs on {', '.join(stores_of(self.scenario))} only")
        for name, value in (DEFAULTS | OWN_DEFAULTS.get(self.scenario, {})).items():
            if not getattr(self, name):
                setattr(self, name, value)
        if not self.ttl:
            self.ttl = TTL.get(self.scenario, TTL.get(self.store, 2.0))
        if self.cs_max is None and self.store == "sqlite":
            self.cs_max = SQLITE_SECTION * self.ttl
        if self.cs_max is None:
            # A ttl: 2 s on the stores whose ttl is 2 s, as before the ttl depended on the store.
            self.cs_max = LONG_SECTIONS.get(self.scenario, 0) * self.ttl or self.ttl

    @property
    def atomic_share(self) -> float:
        """The share of rounds with the atomic canary (0: none)."""
        if self.scenario in NO_ATOMIC_CANARY:
            return 0.0
        return ATOMIC_CANARY.get(self.store, 0.0)


class Run(EtcdFaults, SentinelFaults, StandbyFaults):
    def __init__(self, config: RunConfig, servers: Servers) -> None:
        self.config = config
        self.servers = servers
        self.rng = random.Random(config.seed)
        self.out = config.out or Path(
            tempfile.mkdtemp(prefix=f"faults-{config.store}-{config.scenario}-")
        )
        self.out.mkdir(parents=True, exist_ok=True)
        self.keys = [f"faults:{i}" for i in range(config.keys)]
        self.record = History(str(self.out / "nemesis.jsonl"), "nemesis")
        self.tracker = Tracker()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.routes: dict[int, list[int]] = {}  # pid -> its proxy routes (one per etcd member)
        self.faketime: dict[int, Path] = {}
        self.stopped: set[int] = set()
        self.redis: Any = None
        self.etcd: EtcdCluster | None = None
        self.sentinel: SentinelServers | None = None
        self.pair: StandbyPair | None = None
        self.proxy: Proxy | None = None
        self.stop = threading.Event()
        self.stop_at = 0.0
        self.spawned = 0
        self.rotation: list[str] = []

    # Setting up.

    def store_spec(self, routes: list[int]) -> tuple[dict[str, Any], int | None]:
        """The worker's store, and the port its ``store`` database alias connects to."""
        port: int | None = None
        if routes:
            assert self.proxy is not None
            port = self.proxy.port(routes[0])
        if self.config.store == "etcd":
            return etcd_spec(self.cluster, self.proxy, routes), None
        if self.sentinel is not None:
            return self.sentinel_spec(), None
        if self.config.store == "redis":
            assert self.redis is not None
            return {"kind": "redis", "url": f"redis://127.0.0.1:{port or self.redis.port}/0"}, None
        if self.config.store == "sqlite":
            return {"kind": "sqlite", "using": "store"}, None
        if self.config.scenario == "atomic_pgbouncer":
            bouncer = self.servers.start_pgbouncer()
            # Release notices need a session: waiters LISTEN on the direct connection.
            return {"kind": "postgres", "using": "store", "listen": "default"}, bouncer.port
        return {"kind": "postgres", "using": "store", "listen": True}, port

    def spawn_worker(self) -> int:
        index = self.spawned
        self.spawned += 1
        routes: list[int] = []
        if self.proxy is not None and self.config.store == "etcd":
            routes = etcd_routes(self.cluster, self.proxy)
        elif self.proxy is not None and self.sentinel is None and self.pair is None:
            assert self.servers.postgres is not None
            upstream = (
                self.redis.port if self.config.store == "redis" else self.servers.postgres.port
            )
            routes = [self.proxy.add_route(("127.0.0.1", upstream))]
        spec, port = self.store_spec(routes)
        history = self.out / f"worker-{index}.jsonl"
        worker = {
            "name": f"w{index}",
            "seed": self.config.seed * 1000 + index,
            "history": str(history),
            "ttl": self.config.ttl,
            "cs_max": self.config.cs_max,
            "keys": self.keys,
            "permits": self.config.permits,
            "stop_at": self.stop_at,
            "store": spec,
            "atomic": self.config.scenario == "atomic_pgbouncer",
            "scenario": self.config.scenario,
            "max_hold": self.config.max_hold or None,
            "atomic_canary": self.config.atomic_share > 0,
            "atomic_share": self.config.atomic_share,
        }
        store = self.pair_database() if self.pair is not None else None
        sqlite = self.config.store == "sqlite"
        env = self.servers.env(port, worker=worker, sqlite=sqlite, store=store)
        if self.config.scenario == "wallclock":
            rc = self.out / f"faketime-{index}.rc"
            rc.write_text("+0\n")
            env |= {
                "LD_PRELOAD": LIBFAKETIME,
                "FAKETIME_TIMESTAMP_FILE": str(rc),
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                "FAKETIME_CACHE_DURATION": "1",
            }
        with open(self.out / f"worker-{index}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.worker"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[proc.pid] = proc
        self.tracker.follow(proc.pid, history)
        if routes:
            self.routes[proc.pid] = routes
        if self.config.scenario == "wallclock":
            self.faketime[proc.pid] = self.out / f"faketime-{index}.rc"
        return proc.pid

    def spawn_leader(self) -> int:
        index = self.spawned
        self.spawned += 1
        assert self.servers.postgres is not None
        if self.config.store == "redis":
            locks = {
                "BACKEND": "django_locks.stores.RedisStore",
                "OPTIONS": {"url": self.redis.url},
            }
        else:
            locks = {
                "BACKEND": "django_locks.stores.DatabaseStore",
                "OPTIONS": {"using": "postgres"},
            }
        env = child_env(postgres=self.servers.database(), locks=locks, leader_database="postgres")
        args = ["run_leader", LEADER_KEY, "--ttl", f"{self.config.ttl}s", "--grace", "3s"]
        with open(self.out / f"leader-{index}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "django", *args, "--settings=tests.leader_settings"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[proc.pid] = proc
        return proc.pid

    # The run.

    def rows(self) -> list[str]:
        """The protected rows' keys: one per key, or with permits one per permit (``k#n``), the
        resource a permit's token fences (SPEC section 6)."""
        if self.config.permits == 1:
            return self.keys
        return [f"{key}#{n}" for key in self.keys for n in range(1, self.config.permits + 1)]

    def execute(self) -> Report:
        config = self.config
        self.servers.reset(self.rows(), sqlite=config.store == "sqlite")
        # The run_leader writer's own row (tests/testapp/leaders.py): fenced increments.
        self.servers.sql(
            "INSERT INTO testapp_stockcount (product, count, fencing_token) VALUES (%s, 0, 0)",
            LEADER_KEY,
        )
        if config.scenario in SENTINEL_SCENARIOS:
            self.start_sentinel()
        elif config.scenario in STANDBY_SCENARIOS:
            self.servers.migrate_store(self.start_pair().database_settings())
        elif config.store == "redis":
            fsync = "everysec" if config.scenario == "store_restart_everysec" else "always"
            self.redis = start_redis(fsync)
        if config.store == "etcd":
            self.etcd = start_etcd()
            # For the checker: P5's bound on etcd (tests/faults/figures.py).
            endpoints = self.etcd.endpoints
            self.record("cluster", endpoints=endpoints, ttl=config.ttl, election_s=ELECTION_S)
        if config.scenario in ("hung_connection", "permits", "replace", "etcd_hung_route"):
            self.proxy = Proxy().start()
        warmup = 3.0
        self.stop_at = time.monotonic() + warmup + config.duration
        nemesis = threading.Thread(target=self.nemesis, name="nemesis")
        try:
            if config.scenario == "leader":
                for _ in range(3):
                    self.spawn_leader()
            else:
                for _ in range(config.workers):
                    self.spawn_worker()
            time.sleep(warmup)
            nemesis.start()
            self.stop.wait(max(0.0, self.stop_at - time.monotonic()))
        finally:
            self.stop.set()
            if nemesis.is_alive():
                nemesis.join(timeout=30)
            self.shutdown()
        if self.nemesis_failed is not None:
            raise RuntimeError(
                f"The nemesis of {config.scenario} failed: {self.nemesis_failed!r}"
            ) from self.nemesis_failed
        return self.finish()

    def shutdown(self) -> None:
        for pid in list(self.stopped):
            os.kill(pid, signal.SIGCONT)
        if self.proxy is not None:
            for route in self.proxy.routes():
                self.proxy.resume(route)
        if self.config.scenario in ("store_pause",):
            self.pause_store(False)
        if self.config.scenario == "leader":
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        # Workers stop on their own at stop_at, after their round (and a delayed write).
        give_up = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self.proxy is not None:
            self.proxy.stop()
        if self.redis is not None:
            self.redis.destroy()
        if self.etcd is not None:
            self.etcd.destroy()
        if self.sentinel is not None:
            self.sentinel.destroy()
        if self.pair is not None:
            self.pair.destroy()

    def finish(self) -> Report:
        kinds = {"f": "fenced", "c": "canary", "a": "atomic"}
        for product, value in self.servers.counters(sqlite=self.config.store == "sqlite"):
            kind, _, key = product.partition(":")
            if kind in kinds:
                self.record("counter", kind=kinds[kind], key=key, value=value)
        if self.config.scenario == "leader":
            rows = self.servers.sql(
                "SELECT key, pid, fencing_token, started, ended, accepted FROM testapp_leaderwrite"
            )
            for key, pid, token, started, ended, accepted in rows:
                self.record(
                    "write",
                    kind="leader",
                    key=key,
                    pid=pid,
                    token=int(token),
                    start=started,
                    end=ended,
                    accepted=bool(accepted),
                )
        events = read_history(sorted(self.out.glob("*.jsonl")))
        report = check(events)
        label = (
            f"[{self.config.store} {self.config.scenario} {self.config.duration:g}s "
            f"seed={self.config.seed}] "
        )
        (self.out / "report.json").write_text(
            json.dumps(
                {
                    "config": asdict(self.config) | {"out": str(self.out)},
                    "summary": report.summary(label),
                    **report.as_dict(),
                },
                indent=1,
            )
        )
        report.details.insert(0, f"history in {self.out}")
        self.label = label
        return report


def run(config: RunConfig, servers: Servers | None = None) -> tuple[Report, str]:
    """One run; ``servers`` shared by several runs, else started and destroyed here. Returns
    the report and its one-line summary."""
    own = servers is None
    if servers is None:
        servers = Servers().start()
    try:
        fault_run = Run(config, servers)
        report = fault_run.execute()
        return report, report.summary(fault_run.label)
    finally:
        if own:
            servers.destroy()
