"""on_one_instance under @task() on the database backend: every run fails (django_locks.E003).
Imported by the test and by the worker that runs the task, never at a worker's start (a worker
runs the system checks when it starts, and E003 would stop it)."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

from django_locks import on_one_instance
from tests.tasks_app.compat import task


@task()
@on_one_instance("tasks-test:once")
def nightly() -> None:
    """Never runs: refused with ImproperlyConfigured naming run_leader --exec."""
