"""Real worker, beat and manage.py processes on one SQLite file and one Redis, for the tests.

Every process runs in its own session, so teardown kills it with its children (a prefork worker's
pool) by process group. Logs go to files the fixture prints on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.children.env import child_env

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "tests.celeryapp.settings"


def base_env(**values: Any) -> dict[str, str]:
    """A Celery test process's environment: ``values`` as in tests.children.env.child_env."""
    outside = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env = child_env(settings=SETTINGS, base=outside, **values)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def migrate(db: Path) -> None:
    """Create every table (the test app by syncdb) in the SQLite file ``db``."""
    env = base_env(sqlite=db, beat_app=True)
    args = [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v", "0"]
    subprocess.run(args, env=env, cwd=ROOT, check=True, timeout=120)


class Processes:
    """A group of test processes sharing one database, broker, store and runs file."""

    def __init__(
        self,
        tmp: Path,
        template_db: Path,
        broker: str,
        *,
        locks: dict[str, Any] | None = None,
        schedule: dict[str, Any] | None = None,
        scheduler: str | None = None,
        hooks: bool = False,
    ) -> None:
        self.tmp = tmp
        self.db = tmp / "db.sqlite3"
        shutil.copy(template_db, self.db)
        self.runs_file = tmp / "runs.jsonl"
        self.runs_file.touch()
        self.broker = broker
        # The beat kill hooks (tests/celeryapp/hooks.py): armed by files in this directory.
        self.hooks = tmp / "hooks" if hooks else None
        if self.hooks is not None:
            self.hooks.mkdir()
        self.env = base_env(
            sqlite=self.db,
            broker=broker,
            locks=locks or {},
            schedule=schedule or {},
            runs=self.runs_file,
            beat_app=True,
            scheduler=scheduler or None,
            beat_hooks=self.hooks,
        )
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        with open(log, "ab") as fh:
            process = subprocess.Popen(
                args,
                env=self.env,
                cwd=ROOT,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append((name, process, log))
        return process

    def worker(self, name: str, concurrency: int = 2) -> subprocess.Popen[bytes]:
        return self.spawn(
            name,
            [
                *celery_cmd(),
                "worker",
                "-l",
                "INFO",
                "-c",
                str(concurrency),
                "-P",
                "prefork",
                "-n",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
        )

    def beat(self, name: str) -> subprocess.Popen[bytes]:
        args = [*celery_cmd(), "beat", "-l", "DEBUG", "--max-interval", "1"]
        args += [
            "-s",
            str(self.tmp / f"{name}-schedule"),
            "--pidfile",
            str(self.tmp / f"{name}.pid"),
        ]
        return self.spawn(name, args)

    def manage(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "django", *args],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def runs(self, task: str | None = None) -> list[dict[str, Any]]:
        text = self.runs_file.read_text(encoding="utf-8")
        # A worker may be writing its line right now: only lines it finished (a newline) count.
        complete = text[: text.rfind("\n") + 1]
        runs = [json.loads(line) for line in complete.splitlines() if line.strip()]
        return [run for run in runs if task is None or run["task"] == task]

    def log(self, name: str) -> str:
        for started, _, log in self.started:
            if started == name:
                return log.read_text(encoding="utf-8", errors="replace")
        raise KeyError(name)

    def pid_of_beat(self, holder: str) -> str:
        """The name of the beat whose process is ``holder`` ("host:pid")."""
        pid = int(holder.rsplit(":", 1)[1])
        for name, process, _ in self.started:
            if process.pid == pid:
                return name
        raise KeyError(holder)

    def process(self, name: str) -> subprocess.Popen[bytes]:
        for started, process, _ in self.started:
            if started == name:
                return process
        raise KeyError(name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        process = self.process(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        if sig == signal.SIGKILL:
            process.wait(timeout=10)

    def arm(self, name: str, when: str, keys: list[str] | None = None) -> None:
        """Arm the kill hook of the beat ``name``: ``when`` "record" or "publish" (``keys``)."""
        assert self.hooks is not None, "Processes(hooks=True) arms beats"
        path = self.hooks / f"arm-{self.process(name).pid}.json"
        path.with_suffix(".tmp").write_text(json.dumps({"when": when, "keys": keys or []}))
        path.with_suffix(".tmp").rename(path)

    def killed(self, name: str) -> dict[str, Any] | None:
        """What the beat ``name`` said before its kill hook SIGKILLed it (None: it has not)."""
        assert self.hooks is not None, "Processes(hooks=True) arms beats"
        path = self.hooks / f"killed-{self.process(name).pid}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def alive(self, name: str) -> bool:
        return self.process(name).poll() is None

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.db, timeout=20) as conn:
            return list(conn.execute(query, params))

    def destroy(self) -> str:
        """Kill every process (and its children); return their logs."""
        for _, process, _ in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        dumps = []
        for name, process, log in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
            dumps.append(f"--- {name} ({log}) ---\n" + "\n".join(text.splitlines()[-80:]))
        return "\n".join(dumps)


def celery_cmd() -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "tests.celeryapp.app"]
