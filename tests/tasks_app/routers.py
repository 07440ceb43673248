"""django-tasks-db's table on the `postgres` alias, where the test db_worker processes find it."""

from __future__ import annotations

from typing import Any

ALIAS = "postgres"
APP = "django_tasks_database"  # django_tasks_db's app label


def _alias() -> str | None:
    from django.conf import settings

    return ALIAS if ALIAS in settings.DATABASES else None


class TasksRouter:
    """django_tasks_db's models read, written and migrated on ``postgres`` when it exists."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return _alias() if model._meta.app_label == APP else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return _alias() if model._meta.app_label == APP else None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label == APP:
            return db == _alias()
        return None
