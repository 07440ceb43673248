"""Settings of the db_worker processes of the django.tasks tests: tests.settings (django-tasks-db
on the `postgres` alias, from DJANGO_LOCKS_TEST_POSTGRES) and the LOCKS of
DJANGO_LOCKS_TEST_LOCKS (the database store on `postgres`)."""

from __future__ import annotations

from tests.children import env as _child
from tests.settings import *  # noqa: F403
from tests.settings import LOCKS as _LOCKS

LOCKS = _child.read_json("LOCKS") or _LOCKS

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_locks": {"level": "DEBUG", "handlers": ["console"]}},
}
