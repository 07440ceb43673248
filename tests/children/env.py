"""The one settings convention of child processes: DJANGO_LOCKS_TEST_* variables, made and read.

A test builds a child's environment with :func:`child_env`; the child's settings module (or the
code it runs) reads each variable with :func:`read` or :func:`read_json`. Stdlib only: settings
modules import it before Django is set up.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "DJANGO_LOCKS_TEST_"

# Every variable (its name after the prefix): what it holds, and who reads it.
VARIABLES: dict[str, str] = {
    "POSTGRES": "the `postgres` alias, a JSON DATABASES entry (tests/settings.py)",
    "DATABASES": "the whole DATABASES setting as JSON (tests/faults/settings.py)",
    "SQLITE": "the SQLite file of the `default` alias (tests/celeryapp/settings.py)",
    "LOCKS": "the LOCKS setting as JSON (tests/leader_settings.py, tests/celeryapp/settings.py)",
    "LOG_LEVEL": "django_locks' log level, NONE for no LOGGING (tests/leader_settings.py)",
    "LEADER_DATABASE": "the alias the test leader writes to (tests/testapp/leaders.py)",
    "BROKER": "the Celery broker URL (tests/celeryapp/settings.py)",
    "SCHEDULE": "Celery beat entries as JSON (tests/celeryapp/settings.py)",
    "SCHEDULER": "the Celery beat scheduler class (tests/celeryapp/settings.py)",
    "BEAT_APP": "1: django_celery_beat in INSTALLED_APPS (tests/celeryapp/settings.py)",
    "RUNS": "where tasks append their runs (tests/celeryapp/tasks.py, tests/tasks_app/tasks.py)",
    "BEAT_HOOKS": "where the beat kill hooks find their arm files (tests/celeryapp/hooks.py)",
    "FAULTS_WORKER": "a fault worker's configuration as JSON (tests/faults/worker.py)",
    "EXPECT_DRIVER": "the PostgreSQL driver a pytest child forced (tests/stores/test_postgres.py)",
}


def _check(name: str) -> str:
    if name not in VARIABLES:
        raise ValueError(f"name must be one of {sorted(VARIABLES)}, got {name!r}")
    return PREFIX + name


def child_env(
    *,
    settings: str | None = None,
    base: Mapping[str, str] | None = None,
    postgres: Mapping[str, Any] | None = None,
    databases: Mapping[str, Any] | None = None,
    sqlite: str | os.PathLike[str] | None = None,
    locks: Mapping[str, Any] | None = None,
    log_level: str | None = None,
    leader_database: str | None = None,
    broker: str | None = None,
    schedule: Mapping[str, Any] | None = None,
    scheduler: str | None = None,
    beat_app: bool = False,
    runs: str | os.PathLike[str] | None = None,
    beat_hooks: str | os.PathLike[str] | None = None,
    faults_worker: Mapping[str, Any] | None = None,
    expect_driver: str | None = None,
) -> dict[str, str]:
    """The environment of a child process.

    ``base`` (default: this process's environment) without any ``DJANGO_LOCKS_TEST_*`` it had, so
    a child gets only what it is given; PYTHONPATH the repository; DJANGO_SETTINGS_MODULE
    ``settings`` when given; then each argument that is not None as its variable (mappings as JSON).
    """
    env = {
        k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(PREFIX)
    }
    env["PYTHONPATH"] = str(ROOT)
    if settings is not None:
        env["DJANGO_SETTINGS_MODULE"] = settings
    values: dict[str, Mapping[str, Any] | str | os.PathLike[str] | None] = {
        "POSTGRES": postgres,
        "DATABASES": databases,
        "SQLITE": sqlite,
        "LOCKS": locks,
        "LOG_LEVEL": log_level,
        "LEADER_DATABASE": leader_database,
        "BROKER": broker,
        "SCHEDULE": schedule,
        "SCHEDULER": scheduler,
        "BEAT_APP": "1" if beat_app else None,
        "RUNS": runs,
        "BEAT_HOOKS": beat_hooks,
        "FAULTS_WORKER": faults_worker,
        "EXPECT_DRIVER": expect_driver,
    }
    for name, value in values.items():
        if value is None:
            continue
        env[_check(name)] = json.dumps(value) if isinstance(value, Mapping) else os.fspath(value)
    return env


def read(name: str, default: str = "") -> str:
    """The variable ``name`` (after the prefix) of this process, else ``default``."""
    return os.environ.get(_check(name)) or default


def read_json(name: str, default: Any = None) -> Any:
    """The variable ``name`` decoded from JSON, else ``default`` (unset or empty)."""
    text = read(name)
    return json.loads(text) if text else default
