"""Settings of the Celery test processes: tests.settings plus what the test passes in DL_* vars.

``DL_DB``: the SQLite file every process shares; ``DL_BROKER``: the Redis broker URL;
``DL_LOCKS``: the ``LOCKS`` setting as JSON; ``DL_SCHEDULE``: beat entries as JSON
(``{"name": {"task": ..., "every": seconds, "args": [...], "kwargs": {...}}}``);
``DL_BEAT_APP``: add django_celery_beat to INSTALLED_APPS; ``DL_RUNS``: where tasks record their
runs.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DL_DB", "/tmp/django_locks-celeryapp.sqlite3"),
        "OPTIONS": {"timeout": 20},
    }
}

if os.environ.get("DL_BEAT_APP"):
    INSTALLED_APPS = [*INSTALLED_APPS, "django_celery_beat"]

LOCKS = json.loads(os.environ.get("DL_LOCKS") or "{}") or {
    "BACKEND": "django_locks.stores.DatabaseStore",
    "TTL": "2s",
}

CELERY_BROKER_URL = os.environ.get("DL_BROKER", "redis://127.0.0.1:6379/1")
CELERY_IMPORTS = ["tests.celeryapp.tasks"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE: dict[str, Any] = {
    name: {
        "task": entry["task"],
        "schedule": timedelta(seconds=entry["every"]),
        "args": entry.get("args", []),
        "kwargs": entry.get("kwargs", {}),
    }
    for name, entry in json.loads(os.environ.get("DL_SCHEDULE") or "{}").items()
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

if os.environ.get("DL_SCHEDULER"):
    CELERY_BEAT_SCHEDULER = os.environ["DL_SCHEDULER"]

# The processes share one SQLite file on purpose.
SILENCED_SYSTEM_CHECKS = ["django_locks.W101", "django_locks.W102"]
