"""Settings of the Celery test processes: tests.settings plus the DJANGO_LOCKS_TEST_* variables.

``SQLITE``: the SQLite file every process shares; ``BROKER``: the Redis broker URL; ``LOCKS``: the
``LOCKS`` setting as JSON; ``SCHEDULE``: beat entries as JSON
(``{"name": {"task": ..., "every": seconds, "args": [...], "kwargs": {...}}}``, with
``"aligned": true`` a tests.celeryapp.schedules.Aligned schedule); ``SCHEDULER``:
the beat scheduler; ``BEAT_APP``: add django_celery_beat to INSTALLED_APPS; ``RUNS`` (read by the
tasks): where tasks record their runs. All of them in tests/children/env.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.children import env as _child
from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _child.read("SQLITE", "/tmp/django_locks-celeryapp.sqlite3"),
        "OPTIONS": {"timeout": 20},
    }
}

if _child.read("BEAT_APP"):
    INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]

LOCKS = _child.read_json("LOCKS") or {
    "BACKEND": "django_locks.stores.DatabaseStore",
    "TTL": "2s",
}

CELERY_BROKER_URL = _child.read("BROKER", "redis://127.0.0.1:6379/1")
CELERY_IMPORTS = ["tests.celeryapp.tasks", "tests.celeryapp.unique_tasks"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True


def _schedule(entry: dict[str, Any]) -> Any:
    every = timedelta(seconds=entry["every"])
    if not entry.get("aligned"):
        return every
    from tests.celeryapp.schedules import Aligned

    return Aligned(every)


CELERY_BEAT_SCHEDULE: dict[str, Any] = {
    name: {
        "task": entry["task"],
        "schedule": _schedule(entry),
        "args": entry.get("args", []),
        "kwargs": entry.get("kwargs", {}),
    }
    for name, entry in _child.read_json("SCHEDULE", {}).items()
}

USE_TZ = True
TIME_ZONE = "UTC"
CELERY_TIMEZONE = "UTC"
DJANGO_CELERY_BEAT_TZ_AWARE = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"django_locks": {"level": "DEBUG"}},
}

if _child.read("SCHEDULER"):
    CELERY_BEAT_SCHEDULER = _child.read("SCHEDULER")

# The processes share one SQLite file on purpose.
SILENCED_SYSTEM_CHECKS = ["django_locks.W101", "django_locks.W102"]
