"""``task`` from Django 6.0's django.tasks or from the django-tasks backport (Django 5.2)."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("django.tasks") is not None:
    from django.tasks import task
    from django.tasks.base import TaskResultStatus
else:  # pragma: no cover - Django 5.2 with the backport
    from django_tasks import task  # type: ignore[no-redef,import-not-found,unused-ignore]
    from django_tasks.base import TaskResultStatus  # type: ignore[no-redef,import-not-found,unused-ignore]

__all__ = ["TaskResultStatus", "task"]
