"""Settings of django_locks' own test suite."""

from __future__ import annotations

import importlib.util

from tests.children import env as _child

SECRET_KEY = "django_locks-tests-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_locks",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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

# The default database is SQLite (its test database is the shared-cache in-memory one). The
# `postgres` and `pgbouncer` aliases point at the throwaway servers tests/servers/postgres.py
# starts: tests/conftest.py adds them after collection when the selected tests need them. A
# process a test starts (a lock holder to kill, Django's own test runner) finds the `postgres`
# alias in DJANGO_LOCKS_TEST_POSTGRES (a JSON DATABASES entry; tests/children/env.py).
DATABASES: dict[str, dict[str, object]] = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
if _child.read("POSTGRES"):
    DATABASES["postgres"] = _child.read_json("POSTGRES")

# The suite's own tests build their Locks explicitly; the configured service uses the in-memory
# store, which DEBUG = False would refuse at startup without this opt-in.
LOCKS = {
    "BACKEND": "django_locks.stores.InMemoryStore",
    "ALLOW_IN_MEMORY_STORAGE": True,
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# django.tasks (Django 6.0+, or the django-tasks backport on 5.2) with django-tasks-db, where
# installed (the `tasks` tox environments): the database backend's table lives on the
# `postgres` alias (tests/tasks_app/routers.py), which its db_worker processes share; the
# immediate and dummy backends are there for the tests of backends without a worker.
if importlib.util.find_spec("django_tasks_db") is not None:
    _TASKS_BASE = "django.tasks" if importlib.util.find_spec("django.tasks") else "django_tasks"
    if _TASKS_BASE == "django_tasks":
        INSTALLED_APPS.append("django_tasks")
    INSTALLED_APPS.append("django_tasks_db")
    DATABASE_ROUTERS = ["tests.tasks_app.routers.TasksRouter"]
    TASKS = {
        "default": {"BACKEND": "django_tasks_db.DatabaseBackend"},
        "immediate": {"BACKEND": f"{_TASKS_BASE}.backends.immediate.ImmediateBackend"},
        "dummy": {"BACKEND": f"{_TASKS_BASE}.backends.dummy.DummyBackend"},
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"django_locks": {"level": "DEBUG"}},
}
