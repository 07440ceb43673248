"""Django configured on one SQLite file, for the children that run SQLite-file scenarios
(sqlite_scenarios.py, sqlite_atomic.py, sqlite_on_commit.py): the database store as the
configured store, django_locks migrated, and the scenario's own tables made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import django
from django.conf import settings


def configure(
    db: str, options: dict[str, Any], *, tables: Sequence[str] = (), migrate: bool = True
) -> None:
    """Set Django up on the file ``db`` with ``options`` (the alias's ``OPTIONS``); migrate it
    and run each ``CREATE TABLE IF NOT EXISTS`` of ``tables`` unless ``migrate`` is False."""
    settings.configure(
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": db, "OPTIONS": options}
        },
        INSTALLED_APPS=["django_locks"],
        USE_TZ=True,
        LOCKS={"BACKEND": "django_locks.stores.DatabaseStore"},
        SILENCED_SYSTEM_CHECKS=["django_locks.W101"],
    )
    django.setup()
    if not migrate:
        return
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {table}")
