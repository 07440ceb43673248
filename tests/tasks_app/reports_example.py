"""The task of the django.tasks testing example (docs/topics/tasks.rst, "Testing"): in a project,
``reports/tasks.py``."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

from django_locks import without_overlapping
from django_locks.contrib.tasks import unique_task
from tests.tasks_app.compat import task

RUNS: list[int] = []


@task()
@unique_task
@without_overlapping("rebuild-report:{customer_id}")
def rebuild_report(customer_id: int, full: bool = False) -> None:
    RUNS.append(customer_id)
