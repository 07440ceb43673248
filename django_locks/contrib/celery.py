"""Celery: ``on_one_instance`` enforced in celery beat, beat's headers, the whole-beat leader mode.

Installed from ``DjangoLocksConfig.ready()`` when Celery is importable. When a beat starts
(``beat_init``, sent by ``celery beat`` and by ``worker -B`` alike) its scheduler *instance* gets
its ``apply_entry`` and ``close`` wrapped, whatever the scheduler class (Celery's default,
django-celery-beat's ``DatabaseScheduler``, a custom one): nothing in the user's settings changes.

* A due entry whose task is decorated with ``on_one_instance`` is published only while this beat
  holds the task's owner lease ``<key>:owner``; it keeps the lease (renewed in the background) and
  hands it back in ``close()``. While the lease is held, publishing costs no store call.
* With ``LOCKS["CELERY_BEAT_LEADER"] = True`` every beat campaigns for one lease per Celery app and
  only the leader publishes any entry; a beat that loses it stops publishing and campaigns again
  at the next due entry.
* Beat marks what it publishes with the headers ``django_locks_key``, ``django_locks_token``,
  ``django_locks_scheduled`` and ``django_locks_beat``; the worker logs them, and warns when a
  decorated task came from a beat that does not enforce ``on_one_instance``.

Workers never take owner leases: ``without_overlapping`` is enforced by the decorator's wrapper
around the run, wherever the task runs.

Here: the signals connected, the decorators' seam (tasks decorated, the running task named), the
worker's side. Beat's side, ``BeatGuard``, is in ``django_locks.contrib.celery_beat``; the Celery
API that is not public, in ``django_locks.contrib.celery_compat``.

Importing this module changes nothing: ``install()`` (called by ``ready()``) connects the
signals; ``django_locks.run`` asks :func:`current_task_name` once Celery is imported (a question,
not a hook: there is nothing to install for it, and no Celery means no Celery task).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

from celery import signals as celery_signals
from celery.app.task import Task
from celery.local import Proxy

from django_locks.contrib import celery_compat
from django_locks.contrib.celery_beat import (
    HANDBACK_GRACE,
    HEADER_BEAT,
    HEADER_CATCH_UP,
    HEADER_KEY,
    HEADER_SCHEDULED,
    HEADER_TOKEN,
    REFUSAL_REPEAT,
    BeatGuard,
    add_headers,
    on_beat_init,
    task_spec,
)
from django_locks.contrib.celery_unique import HEADER_UNIQUE, UniqueTask, unique

# BeatGuard and the header names are imported from here too; they live in celery_beat.py.
# unique and UniqueTask (enqueue-time uniqueness, SPEC section 14) live in celery_unique.py.
__all__ = [
    "HANDBACK_GRACE",
    "HEADER_BEAT",
    "HEADER_CATCH_UP",
    "HEADER_KEY",
    "HEADER_SCHEDULED",
    "HEADER_TOKEN",
    "HEADER_UNIQUE",
    "REFUSAL_REPEAT",
    "BeatGuard",
    "UniqueTask",
    "current_task_name",
    "decorate_task",
    "install",
    "is_task",
    "retry_current_task",
    "task_spec",
    "unique",
]

logger = logging.getLogger("django_locks")

_install_mutex = threading.Lock()
_installed = False


def install() -> None:
    """Connect the Celery signals (idempotent). Called from ``DjangoLocksConfig.ready()``."""
    global _installed
    with _install_mutex:
        if _installed:
            return
        _installed = True
    celery_signals.beat_init.connect(on_beat_init, weak=False, dispatch_uid="django_locks.beat")
    celery_signals.before_task_publish.connect(
        add_headers, weak=False, dispatch_uid="django_locks.headers"
    )
    celery_signals.task_prerun.connect(
        _on_task_prerun, weak=False, dispatch_uid="django_locks.prerun"
    )


# Which task is running: the decorators ask, to let a worker just run an on_one_instance task.


def current_task_name(wrapper: Callable[..., Any]) -> str | None:
    """The name of the Celery task this thread runs when ``wrapper`` is its body, else None."""
    task = celery_compat.current_task()
    if task is None:
        return None
    run = getattr(task, "run", None)
    body = getattr(run, "__func__", run)
    # The body may be wrapped again (celery_unique's run wrapper): follow __wrapped__.
    for _ in range(8):
        if body is wrapper:
            return str(task.name)
        body = getattr(body, "__wrapped__", None)
        if body is None:
            break
    return None


def retry_current_task(
    delay: Callable[[int], float], max_retries: int, exc: BaseException
) -> NoReturn:
    """Retry the task this thread runs (``on_conflict="retry"``): ``Task.retry`` publishes a new
    run of it in ``delay(retries so far)`` seconds and raises ``Retry``; past ``max_retries``
    retries it raises ``exc`` instead (the task fails with it), as does a direct call."""
    task = celery_compat.current_task()
    if task is None:
        raise exc
    retries = getattr(task.request, "retries", 0) or 0
    raise task.retry(countdown=delay(int(retries)), max_retries=max_retries, exc=exc)


# The decorators applied above @shared_task / @app.task: the task object exists already, and the
# worker runs its class's run(), so that is what is replaced, once the app is finalized. Nothing
# public does it: deprecated, with the fix named (a later release refuses the order).

ABOVE_THE_TASK = (
    "on_one_instance / without_overlapping placed above @shared_task or @app.task is "
    "deprecated: it replaces the task class's run(), and a later release refuses it. Put the "
    "decorator below the task decorator (@shared_task first, then @on_one_instance(...) or "
    "@without_overlapping(...), then the function)."
)

_pending: list[tuple[Any, Callable[[Callable[..., Any]], Any]]] = []
_patched: set[tuple[int, int]] = set()
_finalize_hooked = False


def is_task(target: object) -> bool:
    """Whether ``target`` is a Celery task or a task proxy (without evaluating a proxy)."""
    # type(), not isinstance(): isinstance() reads a proxy's __class__, which evaluates it.
    return issubclass(type(target), (Task, Proxy))


def decorate_task(target: Any, decorate: Callable[[Callable[..., Any]], Any]) -> Any:
    """Apply ``decorate`` to the body of the task ``target`` stands for, as soon as the app is
    finalized (at once if it is); return ``target`` unchanged, so ``.delay()`` keeps working.
    Warns (``DeprecationWarning``, at the decorator's line) that the order is deprecated."""
    global _finalize_hooked
    warnings.warn(ABOVE_THE_TASK, DeprecationWarning, stacklevel=_callers_level())
    with _install_mutex:
        _pending.append((target, decorate))
        if not _finalize_hooked:
            _finalize_hooked = True
            celery_compat.on_app_finalize(_on_app_finalize)
    for app in celery_compat.active_apps():
        if app.finalized:
            _patch_pending(app)
    return target


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside django_locks, for the caller of this
    function: the user's decorator line, however many of the package's frames are between."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
        _PACKAGE
    ):
        level, frame = level + 1, frame.f_back
    return level


def _on_app_finalize(app: Any) -> None:
    app.on_after_finalize.connect(_after_finalize, weak=False)


def _after_finalize(sender: Any, **kwargs: Any) -> None:
    _patch_pending(sender)


def _patch_pending(app: Any) -> None:
    for target, decorate in list(_pending):
        task = target if issubclass(type(target), Task) else celery_compat.evaluate(target)
        cls = type(task)
        if (id(cls), id(decorate)) in _patched:
            continue
        raw = cls.__dict__.get("run")
        if isinstance(raw, staticmethod):
            cls.run = staticmethod(decorate(raw.__func__))
        elif callable(raw):
            cls.run = decorate(raw)
        else:
            logger.warning("Cannot decorate Celery task %r: its class has no run()", task.name)
            continue
        _patched.add((id(cls), id(decorate)))


# Worker.


def _on_task_prerun(sender: Any = None, task: Any = None, **kwargs: Any) -> None:
    """Log where a run came from; warn when a decorated task came from an unguarded beat."""
    try:
        _log_origin(task or sender)
    except Exception:
        # A log line is never worth failing (or delaying) the run it describes.
        logger.warning("django_locks could not read where a task run came from", exc_info=True)


def _log_origin(task: Any) -> None:
    if task is None:
        return
    request = getattr(task, "request", None)
    key = getattr(request, HEADER_KEY, None)
    if key is not None:
        logger.debug(
            "Running %s published by beat %s (lease %r, fencing token %s, scheduled %s)",
            task.name,
            getattr(request, HEADER_BEAT, "?"),
            key,
            getattr(request, HEADER_TOKEN, None),
            getattr(request, HEADER_SCHEDULED, None),
        )
        return
    if getattr(request, "celery_beat_task", False):
        spec = task_spec(task)
        if spec is not None and spec.once is not None:
            logger.warning(
                "%s is decorated with on_one_instance but was published by a celery beat that "
                "does not enforce it (django_locks is not in that beat's INSTALLED_APPS, or it "
                "runs an old version): every such beat publishes each tick",
                task.name,
            )
