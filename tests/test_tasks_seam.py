"""django.tasks without a worker: the seam's running result, the decorators under and above
``@task()``, on_one_instance and on_conflict="retry" refused, and the checks (E003, W003).

Runs on the ImmediateBackend (a run happens inside ``enqueue()``, between ``task_started`` and
``task_finished``, as a worker's does) and the configured in-memory store. Needs django.tasks
and django-tasks-db (marker ``tasks``: tox -e py312-django60-tasks).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_locks import limit_concurrency, locks, on_one_instance, without_overlapping

pytestmark = [pytest.mark.tasks, pytest.mark.usefixtures("locks_reset")]


@pytest.fixture
def immediate() -> Any:
    from tests.tasks_app import immediate

    immediate.SEEN.clear()
    return immediate


def lease_state(key: str) -> list[tuple[str, int]]:
    """What the configured store keeps of ``key`` (released leases included)."""
    leases = locks.store.leases(include_inactive=True)
    return [(info.key, info.fencing_token) for info in leases if info.key == key]


def error_path(result: Any) -> str:
    assert result.errors, f"{result} has no error"
    return str(result.errors[-1].exception_class_path)


# The running result.


def test_a_run_sees_its_result_and_its_leases_name_it(immediate: Any) -> None:
    from django_locks.contrib.tasks import current_task_result

    result = immediate.plain.enqueue(3)
    assert result.status == "SUCCESSFUL" and result.return_value == 3
    [seen] = immediate.SEEN
    assert seen["result"].id == result.id
    assert seen["run_lock"] == "tasks-immediate:plain"
    holder = seen["holder"]
    assert (holder.kind, holder.detail) == ("task", result.id)
    assert current_task_result() is None  # forgotten at task_finished


def test_a_failing_run_and_a_finish_without_a_start_leave_nothing_behind(immediate: Any) -> None:
    from django_locks.contrib import tasks as seam
    from tests.tasks_app.compat import task

    result = immediate.once.enqueue()  # fails (ImproperlyConfigured)
    assert result.status == "FAILED"
    assert seam.current_task_result() is None
    # task_finished for a result that never started (and garbage): ignored, never raised.
    seam._on_finished(task_result=result)
    seam._on_finished(task_result=object())
    seam._on_started(task_result=None)
    assert seam.current_task_result() is None
    # A nested run (ImmediateBackend inside a run) and a started result never finished.
    seam._on_started(task_result=result)
    inner = immediate.plain.enqueue(1)
    assert immediate.SEEN[-1]["result"].id == inner.id
    assert seam.current_task_result() is result
    seam._on_finished(task_result=result)
    assert seam.current_task_result() is None
    assert task is not None


def test_a_plain_call_of_the_task_function_is_not_a_task_run(immediate: Any) -> None:
    assert immediate.plain.func(4) == 4
    assert immediate.SEEN[-1]["result"] is None
    assert immediate.SEEN[-1]["holder"].kind != "task"


# Decorator order.


@pytest.mark.parametrize(
    ("decorator", "name"),
    [
        (without_overlapping("tasks-order:a"), "without_overlapping"),
        (limit_concurrency("tasks-order:b", permits=2), "limit_concurrency"),
        (on_one_instance("tasks-order:c"), "on_one_instance"),
    ],
)
def test_a_lock_decorator_above_task_is_refused_naming_the_order(
    immediate: Any, decorator: Any, name: str
) -> None:
    with pytest.raises(TypeError) as raised:
        decorator(immediate.undecorated)
    text = str(raised.value)
    assert f"@{name} is placed above @task()" in text
    assert "tests.tasks_app.immediate.undecorated" in text
    assert f"@task()\n    @{name}(...)\n    def undecorated" in text


# on_one_instance under @task().


def test_on_one_instance_under_task_fails_its_run_naming_run_leader(immediate: Any) -> None:
    result = immediate.once.enqueue()
    assert result.status == "FAILED"
    assert error_path(result) == "django.core.exceptions.ImproperlyConfigured"
    traceback = result.errors[-1].traceback
    assert "run_leader --exec" in traceback and "@without_overlapping" in traceback
    assert lease_state("tasks-immediate:once:owner") == []  # nothing written


def test_the_checks_find_on_one_instance_and_retry_without_defer(immediate: Any) -> None:
    from django_locks.contrib.tasks_checks import NO_DEFER, ON_ONE_INSTANCE, check_tasks

    found = {(m.id, m.obj) for m in check_tasks()}
    assert (ON_ONE_INSTANCE, "tests.tasks_app.immediate.once") in found
    assert (NO_DEFER, "tests.tasks_app.immediate.retry_without_defer") in found
    assert not {obj for _, obj in found} & {
        "tests.tasks_app.immediate.plain",
        "tests.tasks_app.immediate.undecorated",
    }
    [error] = [m for m in check_tasks() if m.obj == "tests.tasks_app.immediate.once"]
    assert error.level >= 40 and "run_leader --exec" in (error.hint or "")
    # The tasks the db_worker tests use: retry on the database backend is fine.
    from tests.tasks_app import tasks as worker_tasks

    assert worker_tasks.retried.get_backend().supports_defer
    assert not [m for m in check_tasks() if "tasks_app.tasks" in str(m.obj)]


def test_the_checks_import_each_installed_app_s_tasks_module() -> None:
    """The usual layout: the task is in an app's tasks.py, which Django does not import."""
    import sys

    from django.conf import settings
    from django.test import override_settings

    from django_locks.contrib.tasks_checks import ON_ONE_INSTANCE, check_tasks

    assert "tests.tasks_autodiscovered.tasks" not in sys.modules
    apps = [*settings.INSTALLED_APPS, "tests.tasks_autodiscovered"]
    with override_settings(INSTALLED_APPS=apps):
        found = {(m.id, m.obj) for m in check_tasks()}
    assert (ON_ONE_INSTANCE, "tests.tasks_autodiscovered.tasks.nightly") in found


def test_manage_py_check_reports_e003(immediate: Any) -> None:
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    with pytest.raises(SystemCheckError, match=r"django_locks\.E003"):
        call_command("check")


# on_conflict="retry" on a backend without supports_defer.


def test_retry_on_a_backend_without_defer_is_refused_at_a_conflict(immediate: Any) -> None:
    assert immediate.retry_without_defer.enqueue().status == "SUCCESSFUL"  # no conflict
    held = locks.acquire("tasks-immediate:retry")
    assert held is not None
    try:
        result = immediate.retry_without_defer.enqueue()
    finally:
        held.release()
    assert result.status == "FAILED"
    assert error_path(result) == "django.core.exceptions.ImproperlyConfigured"
    traceback = result.errors[-1].traceback
    assert "'immediate'" in traceback and "ImmediateBackend" in traceback
    assert "supports_defer is False" in traceback and "django_tasks_db.DatabaseBackend" in traceback


def test_retry_outside_a_task_run_still_names_both_frameworks(immediate: Any) -> None:
    held = locks.acquire("tasks-immediate:retry")
    assert held is not None
    try:
        with pytest.raises(ImproperlyConfigured, match=r"Celery task or a django\.tasks task"):
            immediate.retry_without_defer.func()
    finally:
        held.release()


# The retry count a re-enqueued task carries: odd values refused, nothing written.


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    value=st.one_of(
        st.integers(),
        st.booleans(),
        st.none(),
        st.text(max_size=5),
        st.floats(allow_nan=False, allow_infinity=False),
        st.lists(st.integers(), max_size=2),
    )
)
def test_odd_retry_counts_are_refused_before_anything_is_written(
    immediate: Any, value: object
) -> None:
    from django_locks.contrib.tasks import RETRIES_KWARG

    before = lease_state("tasks-immediate:plain")
    result = immediate.plain.enqueue(1, **{RETRIES_KWARG: value})
    valid = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1000
    if valid:
        assert result.status == "SUCCESSFUL", result.errors
        assert result.return_value == 1  # the count never reaches the function
        return
    assert result.status == "FAILED"
    assert error_path(result) in {"builtins.TypeError", "builtins.ValueError"}
    assert RETRIES_KWARG in result.errors[-1].traceback
    assert lease_state("tasks-immediate:plain") == before
