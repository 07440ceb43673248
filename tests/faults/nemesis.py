"""The fault suite's nemesis: which worker holds what right now (followed in the histories), and
the faults, one kind per scenario, injected every ~10 s by the run's nemesis thread.

``Nemesis`` is the fault half of ``harness.Run``: its methods use the run's processes, servers and
history (declared below, set by ``Run.__init__``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.faults.proxy import Proxy
from tests.faults.servers import Servers, pause_redis
from tests.faults.worker import History

if TYPE_CHECKING:
    from tests.faults.harness import RunConfig

LEADER_KEY = "tests:fenced-writer"  # tests/testapp/leaders.py


class Tracker:
    """Follows the workers' histories as they grow: who holds which key right now."""

    def __init__(self) -> None:
        self.files: dict[int, tuple[Path, int]] = {}  # pid -> (path, offset)
        self.holding: dict[int, tuple[str, int]] = {}  # pid -> (key, token)
        self.until: dict[int, float] = {}  # pid -> end of its current critical section
        self.deadline: dict[int, float] = {}  # pid -> its current holder deadline

    def follow(self, pid: int, path: Path) -> None:
        self.files[pid] = (path, 0)

    def holders(self) -> list[tuple[int, str, int]]:
        for pid, (path, offset) in list(self.files.items()):
            try:
                with open(path, encoding="utf-8") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except FileNotFoundError:
                continue
            complete = data[: data.rfind("\n") + 1]
            self.files[pid] = (path, offset + len(complete.encode()))
            for line in complete.splitlines():
                event = json.loads(line)
                if event["e"] == "ok":
                    self.holding[pid] = (event["key"], event["token"])
                    self.until[pid] = event["t"]
                    self.deadline[pid] = event["deadline"]
                elif event["e"] == "deadline":
                    self.deadline[pid] = event["deadline"]
                elif event["e"] == "cs":
                    self.until[pid] = event["until"]
                elif event["e"] in ("release", "lost", "exit"):
                    self.holding.pop(pid, None)
        return [(pid, key, token) for pid, (key, token) in self.holding.items()]

    def forget(self, pid: int) -> None:
        self.files.pop(pid, None)
        self.holding.pop(pid, None)


PERMITS_FAULTS = ("holder_pause", "holder_kill", "hung_connection")
"""The permits scenario's faults, in turn."""
REPLACE_FAULTS = (*PERMITS_FAULTS, "stale_request")
"""The replace scenario's: the permits scenario's on one holder at a time, and a stale request."""

# A request naming another token than the live lease's (one left by an ended lease), written on
# the live lease of KEYS[1] if its token is ARGV[1] and it carries no request for that token: a
# genuine request is never overwritten (the run waiting on it would then wait in vain).
STALE_REQUEST_SCRIPT = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1]
    and redis.call('HGET', KEYS[1], 'preempt') ~= ARGV[1] then
  redis.call('HSET', KEYS[1], 'preempt', ARGV[2])
  return 1
end
return 0
"""
STALE_REQUEST_SQL = """
UPDATE django_locks_lease SET preempt_token = %s
WHERE key = %s AND fencing_token = %s AND released_at IS NULL AND expires_at > now()
    AND preempt_token IS DISTINCT FROM fencing_token
RETURNING key
"""


class Nemesis:
    """The faults of ``harness.Run``; ``fault_<scenario>`` is called once per fault."""

    config: RunConfig
    servers: Servers
    rng: random.Random
    record: History
    tracker: Tracker
    procs: dict[int, subprocess.Popen[bytes]]
    routes: dict[int, list[int]]  # pid -> its proxy routes (several: one per etcd member)
    faketime: dict[int, Path]
    stopped: set[int]
    redis: Any
    etcd: Any  # the run's EtcdCluster on etcd (tests/faults/etcd_faults.py)
    proxy: Proxy | None
    stop: threading.Event
    stop_at: float
    rotation: list[str]  # the permits scenario's faults still to come in this round

    def spawn_worker(self) -> int:
        raise NotImplementedError

    def spawn_leader(self) -> int:
        raise NotImplementedError

    def pick_holder(self) -> tuple[int, str, int] | None:
        """A worker holding a lock, preferably one whose critical section goes on for a second
        more and past its current deadline (so that a fault strikes while it works)."""
        give_up = time.monotonic() + 3
        holders: list[tuple[int, str, int]] = []
        while time.monotonic() < give_up and not self.stop.is_set():
            holders = [h for h in self.tracker.holders() if h[0] not in self.stopped]
            now = time.monotonic()
            busy = [h for h in holders if self._busy(h[0], now)]
            if busy:
                return self.rng.choice(busy)
            time.sleep(0.02)
        return self.rng.choice(holders) if holders else None

    def _busy(self, pid: int, now: float) -> bool:
        until = self.tracker.until.get(pid, 0)
        return until > max(now + 1, self.tracker.deadline.get(pid, 0) + 0.2)

    def kill_holder(self, holder: tuple[int, str, int]) -> None:
        """SIGKILL a holder (then :meth:`replace_worker` it), recorded as a ``holder_kill``."""
        pid, key, token = holder
        now = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        self.record("fault", kind="holder_kill", pid=pid, key=key, token=token, start=now, end=now)

    def replace_worker(self, pid: int) -> None:
        self.procs[pid].wait(10)
        self.tracker.forget(pid)
        self.spawn_worker()

    def pick_holders(self, count: int) -> list[tuple[int, str, int]]:
        """Up to ``count`` holders of one key: :meth:`pick_holder`'s, then other holders of its
        key (busy ones first)."""
        first = self.pick_holder()
        if first is None:
            return []
        now = time.monotonic()
        others = [
            h
            for h in self.tracker.holders()
            if h[1] == first[1] and h[0] != first[0] and h[0] not in self.stopped
        ]
        self.rng.shuffle(others)
        others.sort(key=lambda h: not self._busy(h[0], now))
        return [first, *others[: count - 1]]

    def current_leader(self) -> int | None:
        rows = self.servers.sql(
            "SELECT pid FROM testapp_leaderwrite WHERE accepted ORDER BY id DESC LIMIT 1"
        )
        return int(rows[0][0]) if rows else None

    def duration(self) -> float:
        return self.rng.uniform(0.5, 3.0) * self.config.ttl

    nemesis_failed: BaseException | None = None

    def nemesis(self) -> None:
        """The faults, until the run's end; a fault that raises ends the run (``execute``
        raises it), since a run whose faults stopped would report a calm it never tested."""
        try:
            self._faults()
        except BaseException as exc:
            self.nemesis_failed = exc
            self.stop.set()
            raise

    def _faults(self) -> None:
        scenario = self.config.scenario
        next_at = time.monotonic() + self.rng.uniform(0.5, 1.2) * self.config.interval
        while True:
            if self.stop.wait(max(0.0, next_at - time.monotonic())):
                return
            if time.monotonic() > self.stop_at - 2:
                return
            if scenario != "baseline":
                getattr(self, f"fault_{scenario}", self.fault_none)()
            next_at += self.rng.uniform(0.7, 1.3) * self.config.interval

    def fault_none(self) -> None:
        pass

    def _stop_process(self, kind: str, pid: int, key: str, token: int | None) -> None:
        pause = self.duration()
        start = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        self.stopped.add(pid)
        self.stop.wait(pause)
        os.kill(pid, signal.SIGCONT)
        self.stopped.discard(pid)
        self.record(
            "fault", kind=kind, pid=pid, key=key, token=token, start=start, end=time.monotonic()
        )

    def fault_holder_pause(self) -> None:
        holder = self.pick_holder()
        if holder is not None:
            self._stop_process("holder_pause", *holder)

    fault_atomic_pgbouncer = fault_holder_pause

    def fault_request_pause(self) -> None:
        holder = self.pick_holder()
        if holder is not None:
            pid, key, token = holder
            now = time.monotonic()
            os.kill(pid, signal.SIGUSR2)  # the worker draws the delay and records it
            self.record(
                "fault", kind="request_pause", pid=pid, key=key, token=token, start=now, end=now
            )

    def fault_delayed_write(self) -> None:
        holder = self.pick_holder()
        if holder is not None:
            pid, key, token = holder
            now = time.monotonic()
            os.kill(pid, signal.SIGUSR1)
            self.record(
                "fault", kind="delayed_write", pid=pid, key=key, token=token, start=now, end=now
            )

    def fault_hung_connection(self, kind: str = "hung_connection") -> None:
        holder = self.pick_holder()
        if holder is None or self.proxy is None:
            return
        pid, key, token = holder
        start = time.monotonic()
        self.hang(pid, True)
        self.stop.wait(self.duration())
        self.hang(pid, False)
        self.record(
            "fault", kind=kind, pid=pid, key=key, token=token, start=start, end=time.monotonic()
        )

    def hang(self, pid: int, hung: bool) -> None:
        """Hang (or resume) every proxy route of the worker ``pid``."""
        assert self.proxy is not None
        for route in self.routes[pid]:
            self.proxy.hang(route) if hung else self.proxy.resume(route)

    def fault_store_pause(self) -> None:
        start = time.monotonic()
        self.pause_store(True)
        self.stop.wait(self.duration())
        self.pause_store(False)
        self.record("fault", kind="store_pause", pid=None, start=start, end=time.monotonic())

    def pause_store(self, paused: bool) -> None:
        if self.config.store == "redis":
            pause_redis(self.redis, paused)
        else:
            self.servers.pause_postgres(paused)

    def fault_store_restart(self) -> None:
        start = time.monotonic()
        if self.config.store == "redis":
            self.redis.kill()
            self.redis.start()
        else:
            self.servers.restart_postgres()
        self.record("fault", kind="store_restart", pid=None, start=start, end=time.monotonic())

    fault_store_restart_everysec = fault_store_restart

    def fault_wallclock(self) -> None:
        holder = self.pick_holder()
        if holder is None:
            return
        pid, key, token = holder
        offset = self.rng.choice(["+3600", "-3600", "+86400", "-86400", "+600", "-600"])
        now = time.monotonic()
        self.faketime[pid].write_text(offset + "\n")
        self.record(
            "fault",
            kind="wallclock",
            pid=pid,
            key=key,
            token=token,
            offset=offset,
            start=now,
            end=now,
        )

    def fault_holder_kill(self) -> None:
        holder = self.pick_holder()
        if holder is None:
            return
        self.kill_holder(holder)
        self.replace_worker(holder[0])

    def fault_leader(self) -> None:
        pid = self.current_leader()
        if pid is None or pid not in self.procs or self.procs[pid].poll() is not None:
            return
        if self.rng.random() < 0.5:
            now = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            self.record("fault", kind="leader_kill", pid=pid, key=LEADER_KEY, start=now, end=now)
            self.procs[pid].wait(10)
            self.spawn_leader()
        else:
            self._stop_process("leader_pause", pid, LEADER_KEY, None)

    def fault_permits(self) -> None:
        """Pauses, kills and hung connections in turn (each round of the three in an order the
        seed draws), each striking one to ``permits`` holders of the key at once: several
        slots then lapse together while their holders still think they hold them."""
        if not self.rotation:
            self.rotation = self.rng.sample(PERMITS_FAULTS, len(PERMITS_FAULTS))
        kind = self.rotation.pop()
        holders = self.pick_holders(self.rng.randint(1, self.config.permits))
        if kind == "hung_connection":
            holders = [h for h in holders if h[0] in self.routes]
        if not holders or (kind == "hung_connection" and self.proxy is None):
            return
        if kind == "holder_kill":
            for pid, key, token in holders:
                now = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                self.record("fault", kind=kind, pid=pid, key=key, token=token, start=now, end=now)
            for pid, _, _ in holders:
                self.procs[pid].wait(10)
                self.tracker.forget(pid)
                self.spawn_worker()
            return
        start = time.monotonic()
        for pid, _, _ in holders:
            if kind == "holder_pause":
                os.kill(pid, signal.SIGSTOP)
                self.stopped.add(pid)
            else:
                self.hang(pid, True)
        self.stop.wait(self.duration())
        for pid, _, _ in holders:
            if kind == "holder_pause":
                os.kill(pid, signal.SIGCONT)
                self.stopped.discard(pid)
            else:
                self.hang(pid, False)
        end = time.monotonic()
        for pid, key, token in holders:
            self.record("fault", kind=kind, pid=pid, key=key, token=token, start=start, end=end)

    def fault_replace(self) -> None:
        """The permits scenario's faults, one holder at a time (permits=1), and in the same
        rotation a stale request written on a holder's live lease, which its renewals must
        ignore (SPEC section 12: renewals of other tokens ignore a request)."""
        if not self.rotation:
            self.rotation = self.rng.sample(REPLACE_FAULTS, len(REPLACE_FAULTS))
        if self.rotation[-1] != "stale_request":
            self.fault_permits()  # takes the next kind of the rotation
            return
        self.rotation.pop()
        holder = self.pick_holder()
        if holder is None:
            return
        pid, key, token = holder
        stale = token - 1  # an older token: whatever held the key before, or nothing did
        start = time.monotonic()
        if self.config.store == "etcd":
            from tests.faults.etcd_faults import stale_request

            written = int(stale_request(self.etcd, key, token, stale))
        elif self.config.store == "redis":
            from django_locks.stores.redis.scripts import names

            client = self.redis.client()
            try:
                written = client.eval(
                    STALE_REQUEST_SCRIPT, 1, names("django_locks", key).lease, token, stale
                )
            finally:
                client.close()
        else:
            written = len(self.servers.sql(STALE_REQUEST_SQL, stale, key, token))
        self.record(
            "fault",
            kind="stale_request",
            pid=pid,
            key=key,
            token=token,
            stale=stale,
            written=bool(written),
            start=start,
            end=time.monotonic(),
        )
