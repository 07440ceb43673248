"""10,000 locks held by one process, renewed on PostgreSQL and Redis: round trips, CPU, expiries.

A child process (``tests/children/scale_holder.py``) acquires the locks (ttl 30 s) and holds them
(one child on each of PostgreSQL, Redis and a 3-master Redis Cluster, at the same time); this
process watches each over three renewal periods (ttl / 3 = 10 s each) and counts what the
server counts: the statements PostgreSQL logged for the child's sessions (``log_statement`` set
on its connections alone), the pipelines Redis received (each ``renew_many`` pipeline opens with
its one ``SCRIPT LOAD``: ``INFO commandstats``). The child's CPU time is read from
``/proc/<pid>/stat``; the leases' expiries are read from the store every 2.5 s, on the store's
clock. Run with ``-s`` to see the figures (docs/internals/performance.rst records them).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

import pytest
from django.db import connections
from redis.crc import key_slot

from django_locks.policy import POLICY
from django_locks.stores.redis import scripts
from tests.children.env import ROOT, child_env

COUNT = 10_000
TTL = 30.0
PERIOD = POLICY.period(TTL)  # 10 s: each lock is renewed once a period
PERIODS = 3
MAX_ROUND_TRIPS = 10  # per renewal period, for all COUNT locks (issue 21)
CPU_GOAL = 0.05  # of one core, user + sys, over the PERIODS periods (issue 21's goal)
# Asserted with a margin: the three children run at once beside five servers on two cores, and
# on 2026-12-02 the same code measured 2.6% to 7.7% from run to run (the previous release's too).
MAX_CPU_SHARE = CPU_GOAL * 1.6
READ_EVERY = 2.5  # seconds between reads of every expiry: a renewal is >= ttl / 6 from the next
TIMER_SLACK = 0.5  # seconds a round may start after its period (the timer thread, a busy machine)
APPLICATION = "django_locks-scale"

pytestmark = [pytest.mark.slow]


class Child:
    """The holding process: its output lines as they come, its CPU time, its report."""

    def __init__(self, args: list[str], env: dict[str, str], stderr: Path) -> None:
        self._stderr_path = stderr
        self._stderr = stderr.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.children.scale_holder", *args],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        assert self.process.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def line(self, prefix: str, timeout: float) -> str:
        """The first line starting with ``prefix``, waited for up to ``timeout`` seconds."""
        give_up = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [line for line in self.lines if line.startswith(prefix)]
                if found:
                    return found[0]
                left = give_up - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise AssertionError(
                        f"no {prefix!r} line from the child after {timeout:g}s (exit status "
                        f"{self.process.poll()}):\n{self.output()}"
                    )
                self._changed.wait(left)

    def rounds(self) -> list[tuple[float, int, float]]:
        """Each ``renew_many`` call the child made: when it returned, its leases, its seconds."""
        with self._changed:
            lines = list(self.lines)
        return [
            (float(end), int(size), float(seconds))
            for _, end, size, seconds in (line.split() for line in lines if line[:6] == "round ")
        ]

    def cpu_seconds(self) -> float:
        """User + system CPU time of the child so far (``/proc/<pid>/stat``, fields 14 and 15)."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def report(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write("report\n")
        self.process.stdin.flush()
        return dict(json.loads(self.line("report ", timeout=30).split(" ", 1)[1]))

    def output(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        with self._changed:
            shown = [line for line in self.lines if not line.startswith("round ")]
        return "\n".join([*shown, self._stderr_path.read_text()[-5000:]])

    def stop(self) -> None:
        """End the child (at the end of its stdin) and read its output to the end."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)
        self._reader.join(timeout=20)
        self._stderr.close()


class Probe(Protocol):
    """What the server says, read from this process."""

    def round_trips(self) -> int:
        """The child's round trips the server received so far."""

    def expiries(self) -> tuple[float, dict[str, float]]:
        """The store's clock now and each held key's expiry on it, in seconds."""

    def close(self) -> None: ...


class PostgresProbe:
    """Each statement the child's sessions send is logged (their own ``log_statement``): one
    statement is one round trip (a ``renew_many`` is one UPDATE ... FROM unnest(...)). A session
    the child opens (``pg_stat_activity``, by its application_name) counts as three more."""

    STATEMENT = re.compile(r"\[(\d+)\] LOG:  (?:statement|execute [^:]*): ")
    SESSION_TRIPS = 3  # TCP's handshake, libpq's SSL request, the startup message

    def __init__(self, conn: Any, log_path: str, prefix: str) -> None:
        self.conn = conn
        self.prefix = prefix
        self.log = open(log_path, "rb")  # noqa: SIM115 (read on from here, closed in close())
        self.log.seek(0, os.SEEK_END)
        self.counted = 0
        self.pids: set[int] = set()  # the backends whose statements were counted
        self.opened: set[int] = set()  # the child's sessions seen so far

    def round_trips(self) -> int:
        for line in self.log.read().decode(errors="replace").splitlines():
            found = self.STATEMENT.search(line)
            if found is not None:
                self.counted += 1
                self.pids.add(int(found.group(1)))
        sessions = self.sessions()
        self.counted += self.SESSION_TRIPS * len(sessions - self.opened)
        self.opened |= sessions
        return self.counted

    def expiries(self) -> tuple[float, dict[str, float]]:
        cursor = self.conn.cursor()
        cursor.execute(
            "SELECT key, extract(epoch FROM expires_at)::float8, "
            "extract(epoch FROM clock_timestamp())::float8 FROM django_locks_lease "
            "WHERE starts_with(key, %s) AND released_at IS NULL",
            (f"{self.prefix}:",),
        )
        rows = cursor.fetchall()
        now = rows[0][2] if rows else 0.0
        return now, {key: expiry for key, expiry, _ in rows}

    def sessions(self) -> set[int]:
        """The backends of the child's connections (its application_name)."""
        cursor = self.conn.cursor()
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APPLICATION,)
        )
        return {pid for (pid,) in cursor.fetchall()}

    def close(self) -> None:
        cursor = self.conn.cursor()
        cursor.execute("DELETE FROM django_locks_lease WHERE starts_with(key, %s)", (self.prefix,))
        self.log.close()


class RedisProbe:
    """Each ``renew_many`` pipeline opens with one ``SCRIPT LOAD`` (then one EVALSHA a lease),
    written in one write and answered before the next: the pipelines are the round trips. On
    Redis Cluster, one pipeline to each master serving some of the leases, counted on each."""

    def __init__(self, prefix: str, masters: list[Any]) -> None:
        self.prefix = prefix
        self.masters = masters  # a lone server, or every master of a cluster
        self.evalsha: list[int] = []  # EVALSHA calls so far, at each count of the round trips
        serving = self._serving(masters)
        self.leases: list[list[tuple[str, bytes]]] = [[] for _ in masters]  # by master
        for i in range(COUNT):
            key = f"{prefix}:{i}"
            lease = scripts.names(prefix, key).lease
            self.leases[serving(lease)].append((key, lease))

    @staticmethod
    def _serving(masters: list[Any]) -> Callable[[bytes], int]:
        """Which of ``masters`` serves a key (read once: the slots do not move here)."""
        if len(masters) == 1:
            return lambda name: 0
        ports = [master.connection_pool.connection_kwargs["port"] for master in masters]
        by_slot = {}
        for first, last, (_, port, *_), *_ in masters[0].execute_command("CLUSTER", "SLOTS"):
            by_slot.update(dict.fromkeys(range(first, last + 1), ports.index(port)))
        return lambda name: by_slot[key_slot(name)]

    def calls(self, command: str) -> int:
        return sum(
            int(master.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))
            for master in self.masters
        )

    def round_trips(self) -> int:
        self.evalsha.append(self.calls("evalsha"))
        return self.calls("script|load")

    def expiries(self) -> tuple[float, dict[str, float]]:
        seconds, micros = self.masters[0].time()  # the masters share this machine's clock
        found = {}
        for master, leases in zip(self.masters, self.leases, strict=True):
            pipe = master.pipeline(transaction=False)
            for _, lease in leases:
                pipe.pexpiretime(lease)
            for (key, _), ms in zip(leases, pipe.execute(), strict=True):
                if ms > 0:
                    found[key] = ms / 1000
        return seconds + micros / 1e6, found

    def close(self) -> None:
        for master in self.masters:
            pipe = master.pipeline(transaction=False)
            for name in master.scan_iter(match=f"{self.prefix}:*", count=1000):
                pipe.delete(name)  # one by one: a cluster's multi-key DEL must keep to a slot
            pipe.execute()
            master.close()


@dataclasses.dataclass
class Figures:
    """What one store's watch found."""

    store: str
    start: float  # the window's start (the child held every lock), on time.monotonic()
    acquired_in: float
    round_trips: list[int]  # per period, counted by the server
    rounds: list[int]  # per period, renew_many calls the child made
    renewed: list[int]  # per period, leases in those calls
    largest: int
    round_seconds: float  # the longest renew_many call
    cpu: list[float]  # per period, seconds of user + sys
    window: float
    load: tuple[float, float]  # 1-minute load average at the start and the end
    reads: list[tuple[float, dict[str, float]]]
    report: dict[str, Any]

    @property
    def cpu_share(self) -> float:
        return sum(self.cpu) / self.window

    def show(self) -> str:
        return (
            f"{self.store}: {COUNT} locks, ttl {TTL:g}s (acquired in {self.acquired_in:.1f}s); "
            f"over {PERIODS} periods of {PERIOD:g}s: round trips {self.round_trips} (server), "
            f"renew_many calls {self.rounds}, leases renewed {self.renewed}, largest batch "
            f"{self.largest}, longest call {self.round_seconds * 1000:.0f} ms; CPU "
            f"{[round(c, 2) for c in self.cpu]} s = {self.cpu_share:.2%} of one core "
            f"(load {self.load[0]:.2f} -> {self.load[1]:.2f} on {os.cpu_count()} cores)"
        )


def measure(store: str, child: Child, probe: Probe) -> Figures:
    """Watch ``child`` for PERIODS renewal periods from the moment it holds every lock."""
    acquired_in = float(child.line("held ", timeout=300).split()[2])
    start = time.monotonic()
    load = os.getloadavg()[0]
    cpu = [child.cpu_seconds()]
    trips = [probe.round_trips()]
    reads = [probe.expiries()]
    # Each boundary's counters before that moment's read of the expiries (a read takes a while).
    events = [(start + PERIOD * k, 0) for k in range(1, PERIODS + 1)]
    events += [
        (start + READ_EVERY * j, 1) for j in range(1, int(PERIOD * PERIODS / READ_EVERY) + 1)
    ]
    for when, what in sorted(events):
        time.sleep(max(when - time.monotonic(), 0))
        if what == 0:
            cpu.append(child.cpu_seconds())
            trips.append(probe.round_trips())
        else:
            reads.append(probe.expiries())
    report = child.report()
    rounds = child.rounds()
    bounds = [start + PERIOD * k for k in range(PERIODS + 1)]
    periods = [
        [r for r in rounds if low <= r[0] < high] for low, high in itertools.pairwise(bounds)
    ]
    return Figures(
        store=store,
        start=start,
        acquired_in=acquired_in,
        round_trips=[b - a for a, b in itertools.pairwise(trips)],
        rounds=[len(period) for period in periods],
        renewed=[sum(size for _, size, _ in period) for period in periods],
        largest=max((size for _, size, _ in rounds), default=0),
        round_seconds=max((seconds for *_, seconds in rounds), default=0.0),
        cpu=[b - a for a, b in itertools.pairwise(cpu)],
        window=PERIOD * PERIODS,
        load=(load, os.getloadavg()[0]),
        reads=reads,
        report=report,
    )


def check(figures: Figures, child: Child, prefix: str) -> None:
    moved = renewal_gaps(figures.reads)
    longest = max(moved.values(), default=float("inf"))
    print(f"{figures.show()}; every expiry moved within {longest:.2f}s of the last")
    assert figures.report == {"held": COUNT, "lost": []}, figures.report
    assert "Lock lost" not in child.output(), child.output()
    assert all(trips <= MAX_ROUND_TRIPS for trips in figures.round_trips), figures.show()
    assert all(rounds <= MAX_ROUND_TRIPS for rounds in figures.rounds), figures.show()
    assert sum(figures.round_trips) >= PERIODS - 1, figures.show()  # it did renew
    assert figures.cpu_share < MAX_CPU_SHARE, figures.show()
    assert moved.keys() == {f"{prefix}:{i}" for i in range(COUNT)}, "leases missing from a read"
    # A round is sent a period after the last; each lease is written during its round's call.
    bound = PERIOD + figures.round_seconds + TIMER_SLACK
    late = {key: gap for key, gap in moved.items() if gap > bound}
    assert not late, f"{len(late)} leases not renewed within {bound:.2f}s: {late}"


def renewal_gaps(reads: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Each key's longest time without its expiry moving, on the store's clock.

    A lease's expiry is the moment it was last renewed (or acquired) plus the ttl, so each value
    read says when it was set; the reads come more often than renewals, so none is missed (a
    missed one could only make a gap look longer). Keys missing from any read are left out."""
    present = set.intersection(*(set(expiries) for _, expiries in reads))
    last_now = reads[-1][0]
    gaps = {}
    for key in present:
        sets = sorted({round(expiries[key] - TTL, 3) for _, expiries in reads})
        steps = [b - a for a, b in itertools.pairwise(sets)]
        gaps[key] = max([*steps, last_now - sets[-1]])
    return gaps


@contextlib.contextmanager
def holding(
    store: str, args: list[str], env: dict[str, str], probe: Probe, tmp_path: Path
) -> Iterator[Child]:
    """The child holding the locks, stopped (its output read to the end) after the block."""
    child = Child(args, env, tmp_path / f"{args[0]}.stderr")
    try:
        yield child
    finally:
        child.stop()
        probe.close()


def on_postgres(server: Any, tmp_path: Path) -> None:
    key_prefix = prefix()
    settings_dict = connections["postgres"].settings_dict
    alias = {name: settings_dict[name] for name in ("ENGINE", "NAME", "USER", "HOST", "PORT")}
    # The child's sessions log their statements, nobody else's (a superuser's connect options).
    options = "-c log_statement=all -c log_parameter_max_length=0"
    alias["OPTIONS"] = {"application_name": APPLICATION, "options": options}
    env = child_env(settings="tests.settings", postgres=alias)
    probe = PostgresProbe(server.connect(settings_dict["NAME"]), server.log, key_prefix)
    args = ["postgres", str(COUNT), str(TTL), key_prefix]
    with holding("PostgreSQL", args, env, probe, tmp_path) as child:
        figures = measure("PostgreSQL", child, probe)
        sessions = probe.sessions()
    assert probe.pids <= sessions, (probe.pids, sessions)  # what was counted was the child's
    check(figures, child, key_prefix)


def on_redis(store: str, probe: RedisProbe, url: str, tmp_path: Path) -> None:
    args = [store, str(COUNT), str(TTL), probe.prefix, url]
    name = {"redis": "Redis", "cluster": "Redis Cluster (3 masters)"}[store]
    with holding(name, args, child_env(settings="tests.settings"), probe, tmp_path) as child:
        figures = measure(name, child, probe)
        child.stop()  # no renewal in flight now: each one the server counted was reported
        sent = probe.calls("evalsha") - probe.evalsha[0]
    check(figures, child, probe.prefix)
    # Every EVALSHA the child sent from the start on was a renewal of a renew_many pipeline.
    rounds = [(end - seconds, size) for end, size, seconds in child.rounds()]
    after = sum(size for began, size in rounds if began >= figures.start)
    during = sum(size for began, size in rounds if began < figures.start)  # none, but for CI
    assert after <= sent <= after + during, (sent, after, during)


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.django_db(transaction=True, databases=["default", "postgres"])
def test_ten_thousand_locks_renew_on_each_server_store(
    postgres_server: Any, redis_server: Any, redis_cluster: Any, tmp_path: Path
) -> None:
    """The three at once, one child process each (the CPU time is each child's own): the
    suite waits out the three renewal periods once, not three times."""
    masters = [node.client() for node in redis_cluster.nodes]
    runs: dict[str, Callable[[], None]] = {
        "PostgreSQL": lambda: on_postgres(postgres_server, tmp_path),
        "Redis": lambda: on_redis(
            "redis", RedisProbe(prefix(), [redis_server.client()]), redis_server.url, tmp_path
        ),
        "Redis Cluster": lambda: on_redis(
            "cluster", RedisProbe(prefix(), masters), redis_cluster.url, tmp_path
        ),
    }
    with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
        done = {name: pool.submit(run) for name, run in runs.items()}
    failed = {name: future.exception() for name, future in done.items() if future.exception()}
    assert not failed, "\n".join(f"{name}: {error!r}" for name, error in failed.items())


def prefix() -> str:
    return f"scale-{uuid.uuid4().hex[:8]}"
