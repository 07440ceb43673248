"""Where django.tasks lives: Django 6.0's ``django.tasks``, or the ``django-tasks`` backport
(import name ``django_tasks``) on Django 5.2; both, when a project has both installed.

Nothing here imports either on its own: :func:`is_task` only looks at the modules already
imported (a ``Task`` can exist only once its module was), so the decorators can ask it at no
cost in a project without django.tasks; :func:`signals` imports what is installed, for the seam's
``install()``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from types import ModuleType
from typing import Any

logger = logging.getLogger("django_locks")

FLAVOURS = ("django.tasks", "django_tasks")
"""The import names of django.tasks: Django's own (6.0+), then the backport's."""


def installed() -> list[str]:
    """The flavours of :data:`FLAVOURS` that can be imported here."""
    found = []
    for name in FLAVOURS:
        try:
            if importlib.util.find_spec(name) is not None:
                found.append(name)
        except (ImportError, ValueError):
            continue
    return found


def signals() -> list[ModuleType]:
    """The ``signals`` modules (``task_started``, ``task_finished``) of every installed flavour
    that imports (a backport that does not support this Django version is logged and left
    out)."""
    modules = []
    for name in installed():
        try:
            modules.append(importlib.import_module(f"{name}.signals"))
        except Exception:
            logger.warning("django_locks could not import %s.signals", name, exc_info=True)
    return modules


def task_classes() -> tuple[type, ...]:
    """The ``Task`` classes of the flavours imported so far."""
    classes = []
    for name in FLAVOURS:
        base = sys.modules.get(f"{name}.base")
        cls = getattr(base, "Task", None) if base is not None else None
        if isinstance(cls, type):
            classes.append(cls)
    return tuple(classes)


def is_task(target: object) -> bool:
    """Whether ``target`` is a django.tasks ``Task`` (what ``@task()`` returns)."""
    classes = task_classes()
    # type(), not isinstance(): isinstance() reads __class__, which a lazy proxy evaluates.
    return bool(classes) and issubclass(type(target), classes)


def above_the_task(decorator: str, target: Any) -> TypeError:
    """The refusal of a lock decorator placed above ``@task()``."""
    name = getattr(target, "module_path", None) or repr(target)
    return TypeError(
        f"@{decorator} is placed above @task() on {name}: it received the django.tasks Task, "
        "not the function, and the worker would run the function without it. Put @task() "
        f"first (outermost), then @{decorator}(...), then the def:\n\n"
        f"    @task()\n    @{decorator}(...)\n    def {getattr(target, 'name', 'job')}(...): ..."
    )
