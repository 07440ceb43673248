"""Three ``run_leader --exec`` instances and what their children recorded (the fault tests of
tests/test_run_leader_exec.py use it).

Each instance runs ``tests/children/exec_recorder.py`` as its COMMAND; the children append their
start, beats and stop to one file. :func:`terms` reads it back as one interval per child, and
:func:`check_one_at_a_time` fails when two of them overlap.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.children.env import child_env

ROOT = Path(__file__).resolve().parents[2]
RECORDER = ROOT / "tests" / "children" / "exec_recorder.py"


@dataclasses.dataclass(frozen=True)
class Term:
    """One child's life as it recorded it: ``end`` is its stop, else its last beat (a
    SIGKILLed child records no stop; it ended within a beat of its last one)."""

    pid: int
    instance: int
    token: int
    start: float
    end: float
    stopped: bool
    code: int | None


def terms(path: Path) -> list[Term]:
    """The children's terms in the order they started."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    complete = text[: text.rfind("\n") + 1]
    seen: dict[int, dict[str, Any]] = {}
    for line in complete.splitlines():
        record = json.loads(line)
        entry = seen.setdefault(
            record["pid"],
            {"instance": int(record["instance"] or -1), "token": int(record["token"] or 0)},
        )
        if record["event"] == "start":
            entry["start"] = record["t"]
        entry["end"] = max(entry.get("end", record["t"]), record["t"])
        if record["event"] == "stop":
            entry["stopped"] = True
            entry["code"] = record.get("code")
    found = [
        Term(
            pid,
            e["instance"],
            e["token"],
            e.get("start", e["end"]),
            e["end"],
            e.get("stopped", False),
            e.get("code"),
        )
        for pid, e in seen.items()
    ]
    return sorted(found, key=lambda term: term.start)


def check_one_at_a_time(found: list[Term], overlap: float = 0.0) -> float:
    """At most one child ran at every instant (two may overlap by ``overlap`` seconds), and
    each later one got a greater fencing token; return the smallest gap between two."""
    assert found, "no child ran"
    gaps = []
    for before, after in itertools.pairwise(found):
        gap = after.start - before.end
        assert gap > -overlap, (
            f"child {after.pid} (instance {after.instance}) started {-gap:.4f}s before child "
            f"{before.pid} (instance {before.instance}) ended: {before} / {after}"
        )
        assert after.token > before.token, f"the tokens went back: {before} / {after}"
        gaps.append(gap)
    return min(gaps, default=float("inf"))


class Fleet:
    """``run_leader --exec`` processes on one store, their children recording to ``records``."""

    def __init__(self, tmp: Path, locks: dict[str, Any], postgres: dict[str, Any]) -> None:
        self.tmp = tmp
        self.records = tmp / "children.jsonl"
        self.env = child_env(
            settings="tests.leader_settings", postgres=postgres, locks=locks, log_level="INFO"
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(
        self,
        key: str,
        mode: list[str],
        *,
        count: int = 3,
        ttl: str = "2s",
        grace: str = "0.5s",
        options: tuple[str, ...] = (),
    ) -> list[subprocess.Popen[bytes]]:
        started = []
        for _ in range(count):
            instance = len(self.procs)
            log = self.tmp / f"run_leader-{instance}.log"
            args = [sys.executable, "-m", "django", "run_leader", "--exec", key]
            args += ["--ttl", ttl, "--grace", grace, *options, "--"]
            args += [sys.executable, str(RECORDER), str(self.records), *mode]
            proc = subprocess.Popen(
                args,
                cwd=ROOT,
                env={**self.env, "EXEC_INSTANCE": str(instance)},
                stdout=log.open("wb"),
                stderr=subprocess.STDOUT,
            )
            self.procs.append(proc)
            self.logs.append(log)
            started.append(proc)
        return started

    def terms(self) -> list[Term]:
        return terms(self.records)

    def running(self) -> Term | None:
        """The child that started last, if it has not stopped (beats within the last 0.2 s)."""
        found = self.terms()
        if not found:
            return None
        last = found[-1]
        return None if last.stopped or time.monotonic() - last.end > 0.2 else last

    def wait_for_child(self, after: float = 0.0, timeout: float = 30.0) -> Term:
        """The first child that started after ``after`` (monotonic seconds)."""
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            later = [term for term in self.terms() if term.start > after]
            if later:
                return later[0]
            time.sleep(0.01)
        raise AssertionError(f"no child started within {timeout}s after {after}:\n{self.dump()}")

    def leader(self, term: Term) -> subprocess.Popen[bytes]:
        return self.procs[term.instance]

    def stop(self, timeout: float = 30.0) -> list[int | None]:
        """SIGTERM (and SIGCONT) every instance still running; their exit codes."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(None)
        return codes

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)
        # Children of killed instances end with their supervisors' timers; wait them out.
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up and self.running() is not None:
            time.sleep(0.05)

    def dump(self) -> str:
        parts = [
            f"--- run_leader {i} ({proc.pid}) ---\n{self.log(i)}"
            for i, proc in enumerate(self.procs)
        ]
        parts.append(f"--- terms ---\n{os.linesep.join(map(str, self.terms()))}")
        return "\n".join(parts)

    def log(self, instance: int) -> str:
        return self.logs[instance].read_text(encoding="utf-8", errors="replace")
