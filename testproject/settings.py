"""Settings of the shop, the demo project: orders and invoices, products and stock.

With no environment variable it runs on what needs no server: SQLite (a file under
``SHOP_DATA_DIR``), the default database store, and kombu's filesystem transport as the Celery
broker. ``testproject/demo.py`` sets these for the processes it starts:

``SHOP_DATA_DIR``
    where the SQLite file, the broker's folders and the accounting system's outbox live
    (default: ``testproject/var``).
``SHOP_DATABASE_URL``
    ``postgresql://user@host:port/name``: PostgreSQL instead of SQLite.
``SHOP_REDIS_URL``
    ``redis://host:port/0``: Redis as the broker (database 1 of that server).
``SHOP_LOCKS_STORE``
    ``redis``: the locks in Redis (needs ``SHOP_REDIS_URL``) rather than in the database.
``SHOP_DEMO``
    ``1``: the demo's short schedule (export every 2 s, reconciliation every 3 s) and a 3 s ttl,
    so that a takeover shows within seconds.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from celery.schedules import crontab

BASE_DIR = Path(__file__).resolve().parent
DATA_DIR = Path(os.environ.get("SHOP_DATA_DIR") or BASE_DIR / "var")
DEMO = os.environ.get("SHOP_DEMO") == "1"
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = "django_locks-shop-not-secret"
DEBUG = True
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_locks",
    "testproject.invoices",
    "testproject.inventory",
]


def database(url: str | None) -> dict[str, Any]:
    if not url:
        # One machine: every process shares this file. The timeout lets a writer wait its turn.
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "shop.sqlite3"),
            "OPTIONS": {"timeout": 20, "init_command": "PRAGMA journal_mode=WAL"},
        }
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


DATABASES = {"default": database(os.environ.get("SHOP_DATABASE_URL"))}
REDIS_URL = os.environ.get("SHOP_REDIS_URL")

# The default store (the Lease table of the default database), unless the demo asks for Redis.
LOCKS: dict[str, Any] = {"TTL": "3s" if DEMO else "30s"}
if os.environ.get("SHOP_LOCKS_STORE") == "redis":
    LOCKS.update(BACKEND="django_locks.stores.RedisStore", OPTIONS={"url": REDIS_URL})

# Celery, configured from these settings (testproject/celery_app.py).
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL.rsplit("/", 1)[0] + "/1"
else:
    # A broker with no server: messages are files in one folder, read by every worker.
    BROKER_DIR = DATA_DIR / "broker"
    for folder in ("queue", "control", "processed"):
        (BROKER_DIR / folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "control_folder": str(BROKER_DIR / "control"),
        # Processed messages are moved next to the queue (an atomic rename on one file system).
        "store_processed": True,
        "processed_folder": str(BROKER_DIR / "processed"),
        "polling_interval": 0.1,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "nightly-invoice-export": {
        "task": "invoices.export_invoices",
        "schedule": timedelta(seconds=2) if DEMO else crontab(hour=2, minute=0),
    },
    "stock-reconciliation": {
        "task": "inventory.reconcile_stock",
        "schedule": timedelta(seconds=3) if DEMO else crontab(minute="*/5"),
    },
}

# The outside systems the shop talks to (testproject/clients.py stands in for them).
ACCOUNTING_OUTBOX = DATA_DIR / "accounting.jsonl"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"short": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "short"}},
    # The root logger prints (Celery's worker replaces its handler with its own): one line each.
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "django_locks": {"level": "DEBUG" if DEMO else "INFO"},
        "shop": {"level": "INFO"},
    },
}
