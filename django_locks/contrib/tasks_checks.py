"""System checks of the decorators under django.tasks' ``@task()`` (``django_locks.E003``,
``django_locks.W003``), registered by ``django_locks.contrib.tasks.install()``.

Which modules are looked at: the modules of the registered jobs (every function decorated with
``on_one_instance``, ``without_overlapping`` or ``limit_concurrency`` claims its keys when it is
decorated, naming its source file). A django.tasks worker imports a task from its function's
``module_path``, so the ``Task`` of a decorated function is an attribute of that same module.
Django imports nothing of django.tasks at startup (a worker imports a task's module when it
runs one), so the check first imports each installed app's ``tasks`` module, where it has one,
as Celery's ``autodiscover_tasks()`` does; task functions in other modules are seen once those
are imported (from an ``AppConfig.ready()``, for example).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.utils.module_loading import autodiscover_modules

from django_locks import registry
from django_locks.contrib import tasks, tasks_compat
from django_locks.job import JobSpec, job_spec

ON_ONE_INSTANCE = "django_locks.E003"
NO_DEFER = "django_locks.W003"


def register() -> None:
    checks.register(check_tasks, "django_locks")


def found_tasks() -> Iterator[tuple[str, Any, JobSpec]]:
    """``(module.attribute, task, spec)`` for each ``Task`` attribute of a registered job's
    module whose function is decorated."""
    classes = tasks_compat.task_classes()
    if not classes:
        return
    # An app's tasks.py that fails to import raises here, as Django's URL checks do for a
    # URLconf: the worker would fail the same way.
    autodiscover_modules("tasks")
    files = {
        os.path.abspath(job.identity[0])
        for job in registry.claimed().values()
        if job.identity[1]  # a function's (file, line); 0: something without code
    }
    seen: set[int] = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__dict__", {}).get("__file__")
        if not isinstance(path, str) or os.path.abspath(path) not in files:
            continue
        for attribute, value in list(vars(module).items()):
            if not issubclass(type(value), classes) or id(value) in seen:
                continue
            spec = job_spec(getattr(value, "func", None))
            if spec is not None:
                seen.add(id(value))
                yield f"{name}.{attribute}", value, spec


def check_tasks(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E003: a ``Task`` wrapping an ``on_one_instance`` function; W003: ``on_conflict="retry"``
    on a task whose backend cannot defer."""
    messages: list[checks.CheckMessage] = []
    for where, task, spec in found_tasks():
        if spec.once is not None:
            messages.append(
                checks.Error(
                    f"{where} is a django.tasks Task wrapping the on_one_instance function "
                    f"{spec.name}: a task has no scheduler process to keep an owner lease "
                    "in, so each of its runs fails with ImproperlyConfigured.",
                    hint="Run the scheduler that enqueues it under `manage.py run_leader "
                    "--exec KEY -- COMMAND ...` (one instance enqueues), and remove "
                    "@on_one_instance; use @without_overlapping if what you want is that its "
                    "runs never overlap.",
                    obj=where,
                    id=ON_ONE_INSTANCE,
                )
            )
        if spec.run is not None and spec.run.on_conflict == "retry":
            try:
                backend = task.get_backend()
            except Exception:
                continue  # django.tasks' own check reports a backend it cannot build
            if not getattr(backend, "supports_defer", False):
                messages.append(
                    checks.Warning(
                        tasks.no_defer(where, task.backend, backend, None),
                        hint="A run that finds its run lock taken fails with "
                        "ImproperlyConfigured instead of being enqueued again.",
                        obj=where,
                        id=NO_DEFER,
                    )
                )
    return messages
