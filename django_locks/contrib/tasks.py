"""django.tasks: the decorators under ``@task()``, the holder of a run's leases, the retries.

Installed from ``DjangoLocksConfig.ready()`` when ``django.tasks`` (Django 6.0+) or the
``django-tasks`` backport (``django_tasks``, Django 5.2) is importable: ``install()`` connects
``task_started`` / ``task_finished``, whose receivers keep the ``TaskResult`` this thread (or
coroutine) is running, and registers the system checks (``django_locks.contrib.tasks_checks``).

* A decorated function that is the body of the running result's task (``@task()`` above
  ``@without_overlapping`` / ``@limit_concurrency``) is a task run: its run lock holds across
  workers, and ``on_conflict="retry"`` enqueues the task again with ``run_after`` (a backend
  with ``supports_defer`` only), carrying the retry count in the kwarg :data:`RETRIES_KWARG`,
  which the decorator strips before the call.
* ``on_one_instance`` under ``@task()`` fails its runs (``ImproperlyConfigured``): a task has no
  scheduler process to keep an owner lease in; ``run_leader --exec`` is the fix.
* Leases taken during a run name the result id as their holder's ``detail`` (kind ``"task"``).

:func:`current_task_result` answers "which django.tasks result does this thread run?" for the
rest of the package (``enqueue_unique``'s worker side among them).
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import logging
import threading
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_locks.contrib import tasks_compat

# SPEC section 14's names, re-exported.
from django_locks.contrib.tasks_unique import enqueue_unique as enqueue_unique
from django_locks.contrib.tasks_unique import try_enqueue_unique as try_enqueue_unique
from django_locks.contrib.tasks_unique import unique_task as unique_task
from django_locks.exceptions import LockNotAcquiredError

logger = logging.getLogger("django_locks")

RETRIES_KWARG = "_django_locks_retries"
"""The keyword argument a task enqueued again by ``on_conflict="retry"`` carries: how many
retries came before it. The decorator removes it before calling the function."""

MAX_DEPTH = 32
"""The most results kept as running in one context (an ``ImmediateBackend`` runs a task
enqueued by a running one inside it; a ``task_finished`` never sent leaves one behind)."""

_running: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
    "django_locks_task_results", default=()
)

_install_mutex = threading.Lock()
_installed = False


def install() -> None:
    """Connect the receivers of every installed django.tasks flavour and register the checks
    (idempotent). Called from ``DjangoLocksConfig.ready()``."""
    global _installed
    with _install_mutex:
        if _installed:
            return
        _installed = True
    for module in tasks_compat.signals():
        uid = f"django_locks.tasks.{module.__name__}"
        module.task_started.connect(_on_started, weak=False, dispatch_uid=f"{uid}.started")
        module.task_finished.connect(_on_finished, weak=False, dispatch_uid=f"{uid}.finished")
    from django_locks.contrib import tasks_checks

    tasks_checks.register()


# The running result. The worker sends both signals in the thread that runs the task (and
# django.tasks' own Task.call() runs a coroutine function through async_to_sync, which copies
# the context): a context variable follows the run where a thread-local would not.


def _on_started(sender: Any = None, task_result: Any = None, **kwargs: Any) -> None:
    # Signal.send() lets a receiver's exception through: it would fail the run it describes.
    try:
        if task_result is None:
            return
        stack = _running.get()
        _running.set((*stack[-(MAX_DEPTH - 1) :], task_result))
    except Exception:
        logger.warning("django_locks could not follow a django.tasks run", exc_info=True)


def _on_finished(sender: Any = None, task_result: Any = None, **kwargs: Any) -> None:
    try:
        result_id = getattr(task_result, "id", None)
        stack = _running.get()
        for depth in range(len(stack) - 1, -1, -1):
            if getattr(stack[depth], "id", None) == result_id:
                # Results above it (started, never finished) ended with it.
                _running.set(stack[:depth])
                return
        # A task_finished without its task_started (a backend that sends only this one, or a
        # run that failed before it started): nothing to forget.
    except Exception:
        logger.warning("django_locks could not follow a django.tasks run", exc_info=True)


def current_task_result() -> Any | None:
    """The django.tasks ``TaskResult`` this thread (or coroutine) is running, else None: set
    between ``task_started`` and ``task_finished``, whichever backend sends them."""
    stack = _running.get()
    return stack[-1] if stack else None


def current_result_id() -> str | None:
    """The id of :func:`current_task_result` (the ``detail`` of the leases a run takes)."""
    result = current_task_result()
    result_id = getattr(result, "id", None) if result is not None else None
    return str(result_id) if result_id is not None else None


def runs_body(result: Any, wrapper: Callable[..., Any]) -> bool:
    """Whether ``wrapper`` is the body of ``result``'s task: its ``func``, or a function that
    ``func`` wraps (another decorator between ``@task()`` and this one)."""
    func = getattr(getattr(result, "task", None), "func", None)
    for _ in range(100):
        if func is None:
            return False
        if func is wrapper:
            return True
        func = getattr(func, "__wrapped__", None)
    return False


# A decorated function's run as a task.


@dataclasses.dataclass(frozen=True)
class TaskRun:
    """A decorated function running as the body of the django.tasks ``result``; ``retries``:
    how many ``on_conflict="retry"`` re-enqueues came before it."""

    result: Any
    retries: int = 0

    @property
    def name(self) -> str:
        task = self.result.task
        return str(getattr(task, "module_path", None) or getattr(task, "name", "?"))

    def retry(self, delay: Callable[[int], float], max_retries: int, exc: BaseException) -> None:
        """Enqueue the task again to run in ``delay(retries so far)`` seconds (``run_after``),
        with the same arguments and the retry count one higher; past ``max_retries`` retries
        raise ``exc`` (the run fails with it). Refused on a backend without ``supports_defer``."""
        task = self.result.task
        backend = task.get_backend()
        if not getattr(backend, "supports_defer", False):
            raise ImproperlyConfigured(no_defer(self.name, task.backend, backend, exc))
        if self.retries >= max_retries:
            raise exc
        from django.utils import timezone

        seconds = delay(self.retries)
        run_after = timezone.now() + datetime.timedelta(seconds=seconds)
        kwargs = {**self.result.kwargs, RETRIES_KWARG: self.retries + 1}
        again = task.using(run_after=run_after).enqueue(*self.result.args, **kwargs)
        logger.info(
            "Retrying %s (result %s, retry %d of %d) as result %s after %s: %s",
            self.name,
            self.result.id,
            self.retries + 1,
            max_retries,
            getattr(again, "id", "?"),
            f"{run_after:%Y-%m-%d %H:%M:%S} UTC (in {seconds:.1f}s)",
            exc,
        )


def task_run(wrapper: Callable[..., Any], kwargs: dict[str, Any]) -> TaskRun | None:
    """The run ``wrapper`` makes as the body of the running django.tasks result, else None;
    takes :data:`RETRIES_KWARG` out of ``kwargs`` (the call's own dict) when it runs one."""
    result = current_task_result()
    if result is None or not runs_body(result, wrapper):
        return None
    retries = kwargs.pop(RETRIES_KWARG, 0)
    return TaskRun(result, check_retries(retries))


def check_retries(value: object) -> int:
    """The retry count a message carries: an int from 0 to the most ``max_retries``."""
    from django_locks.conflicts import MAX_RETRIES

    rule = (
        f"`{RETRIES_KWARG}` (the retry count django_locks passes to a task it enqueues again) "
        f"must be an int from 0 to {MAX_RETRIES}"
    )
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{rule}, got {value!r}")
    if not 0 <= value <= MAX_RETRIES:
        raise ValueError(f"{rule}, got {value!r}")
    return value


def backend_path(backend: object) -> str:
    cls = type(backend)
    return f"{cls.__module__}.{cls.__qualname__}"


def no_defer(name: str, alias: str, backend: object, exc: BaseException | None) -> str:
    """Why ``on_conflict="retry"`` cannot work on ``backend``, and the fix."""
    found = f" (its run lock is taken: {exc})" if isinstance(exc, LockNotAcquiredError) else ""
    return (
        f"{name} is decorated with on_conflict='retry', but its django.tasks backend "
        f"{alias!r} ({backend_path(backend)}) cannot enqueue a task to run later "
        f"(supports_defer is False), so nothing can run it again{found}. Use a backend that "
        "supports run_after (django_tasks_db.DatabaseBackend, with manage.py db_worker) for "
        "this task (@task(backend=...)), or give it on_conflict='skip' or 'raise'."
    )


def on_one_instance_refusal(name: str) -> str:
    """Why ``on_one_instance`` cannot work under ``@task()``, and the fix."""
    return (
        f"{name} is decorated with @on_one_instance under @task(): a django.tasks task runs "
        "wherever a worker takes it, and no scheduler process keeps an owner lease for it, so "
        "its runs are refused. To enqueue it from one instance only, run the scheduler that "
        "enqueues it under `manage.py run_leader --exec KEY -- COMMAND ...`; if what you want "
        "is that its runs never overlap, use @without_overlapping instead."
    )


def refuse_on_one_instance(name: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(on_one_instance_refusal(name))
