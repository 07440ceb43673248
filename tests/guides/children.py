"""The guides' child processes: each in its own session (teardown kills its process group, with
any processes of its own), its output in a log file that teardown returns for the test's report."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.children.env import child_env

ROOT = Path(__file__).resolve().parents[2]


class Children:
    """Processes of one test sharing a runs file (tests/guides/runs.py) and one environment."""

    def __init__(
        self, tmp: Path, *, settings: str = "tests.guides.settings", **values: Any
    ) -> None:
        self.tmp = tmp
        self.runs_file = tmp / "runs.jsonl"
        self.runs_file.touch()
        outside = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        self.env = child_env(settings=settings, base=outside, runs=self.runs_file, **values)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.started: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def start(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        """Run ``python <args>`` as the child ``name``."""
        log = self.tmp / f"{name}.log"
        with open(log, "ab") as fh:
            process = subprocess.Popen(
                [sys.executable, *args],
                env=self.env,
                cwd=ROOT,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started[name] = (process, log)
        return process

    def run(self, args: Sequence[str], timeout: float = 60) -> None:
        """Run ``python <args>`` to its end (a migration), failing with its output."""
        done = subprocess.run(
            [sys.executable, *args], env=self.env, cwd=ROOT, capture_output=True, timeout=timeout
        )
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()

    def pid(self, name: str) -> int:
        return self.started[name][0].pid

    def signal(self, name: str, signum: int) -> None:
        """Send ``signum`` to the child ``name`` itself (SIGKILL: its whole group)."""
        process = self.started[name][0]
        if signum == signal.SIGKILL:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)

    def wait(self, name: str, timeout: float = 10) -> int:
        return self.started[name][0].wait(timeout=timeout)

    def runs(self, event: str | None = None) -> list[dict[str, Any]]:
        text = self.runs_file.read_text(encoding="utf-8")
        complete = text[: text.rfind("\n") + 1]  # a line being written does not count yet
        runs = [json.loads(line) for line in complete.splitlines() if line.strip()]
        return [run for run in runs if event is None or run["event"] == event]

    def destroy(self) -> str:
        """Kill every child (and its processes); return the end of their logs."""
        for process, _ in self.started.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        dumps = []
        for name, (process, log) in self.started.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
            dumps.append(f"--- {name} ({log}) ---\n" + "\n".join(text.splitlines()[-60:]))
        return "\n".join(dumps)


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans ``(start, end)`` open at one instant (an end sorts before a start)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def spans(runs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """``(start, end)`` of each complete run: ``start`` / ``end`` events sharing a ``run`` id."""
    starts = {run["run"]: run["at"] for run in runs if run["event"] == "start"}
    return sorted((starts[run["run"]], run["at"]) for run in runs if run["event"] == "end")
