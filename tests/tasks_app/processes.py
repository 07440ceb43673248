"""Real ``manage.py db_worker`` processes of django-tasks-db on the test database of the
`postgres` alias, for the django.tasks tests.

Each worker runs in its own session (teardown kills its process group); its output goes to a log
file the fixture prints on failure. The tasks (tests/tasks_app/tasks.py) append their runs to one
JSON-lines file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.children.env import child_env

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "tests.tasks_app.settings"


def postgres_alias() -> dict[str, Any]:
    """The `postgres` alias of this process (its NAME is the test database)."""
    from django.db import connections

    settings_dict = connections["postgres"].settings_dict
    return {name: settings_dict[name] for name in ("ENGINE", "NAME", "USER", "HOST", "PORT")}


class Workers:
    """db_worker processes sharing the test database, the database lock store and a runs file."""

    def __init__(self, tmp: Path, *, ttl: str = "2s") -> None:
        self.tmp = tmp
        self.runs_file = tmp / "runs.jsonl"
        self.runs_file.touch()
        outside = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        self.env = child_env(
            settings=SETTINGS,
            base=outside,
            postgres=postgres_alias(),
            locks={
                "BACKEND": "django_locks.stores.DatabaseStore",
                "OPTIONS": {"using": "postgres"},
                "TTL": ttl,
            },
            runs=self.runs_file,
        )
        self.env["PYTHONUNBUFFERED"] = "1"
        self.started: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(self, name: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        args = [sys.executable, "-m", "django", "db_worker", "--interval", "0.05"]
        args += ["--no-startup-delay", "--no-reload", "--worker-id", name, "-v", "2"]
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

    def pids(self) -> set[int]:
        return {process.pid for _, process, _ in self.started}

    def runs(self, task: str | None = None) -> list[dict[str, Any]]:
        text = self.runs_file.read_text(encoding="utf-8")
        complete = text[: text.rfind("\n") + 1]  # a line being written does not count yet
        runs = [json.loads(line) for line in complete.splitlines() if line.strip()]
        return [run for run in runs if task is None or run["task"] == task]

    def destroy(self) -> str:
        """Kill every worker (and its children); return the end of their logs."""
        for _, process, _ in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        dumps = []
        for name, process, log in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
            dumps.append(f"--- {name} ({log}) ---\n" + "\n".join(text.splitlines()[-60:]))
        return "\n".join(dumps)
