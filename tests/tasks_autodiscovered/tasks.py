"""``on_one_instance`` under ``@task()`` in an app's tasks.py, which nothing else imports."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

from django_locks import on_one_instance
from tests.tasks_app.compat import task


@task(backend="immediate")
@on_one_instance("tasks-autodiscovered:nightly")
def nightly() -> None:
    """Found by E003 although no module imports this one."""
