"""Settings of the fault suite's worker processes: the databases come from
DJANGO_LOCKS_TEST_DATABASES (JSON): ``default`` is the protected resource (the counters),
``store`` the lock store's path (direct, through the fault proxy, or through PgBouncer).
Each worker builds its own ``Locks``."""

from __future__ import annotations

from tests.children import env as _child

SECRET_KEY = "django_locks-faults-not-secret"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django_locks", "tests.testapp"]
DATABASES = _child.read_json("DATABASES") or {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
}
LOCKS = {"BACKEND": "django_locks.stores.InMemoryStore", "ALLOW_IN_MEMORY_STORAGE": True}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_locks": {"handlers": ["console"], "level": "WARNING"}},
}
