"""Celery's private API: every name django_locks uses that Celery does not document, in one place.

Read in the source of Celery 5.4.0 (the oldest supported, ``celery>=5.4`` in pyproject.toml and
tox.ini) and run by the test suite on 5.7.0 (what those resolve to today; no env pins 5.4.0).
``tests/test_celery_seam.py`` fails when ``celery._`` is imported anywhere else in the package; a
new Celery release is checked here first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# ---- Celery private API: begin (checked: Celery 5.4.0, 5.7.0) -------------------------------
# celery._state: the task being run (the public `celery.current_task` is a proxy of this
# function, evaluated through one more private method), the apps created so far, and the
# callbacks run when any app is finalized (`@shared_task` registers its tasks through both).
from celery import _state
from celery._state import _get_active_apps, connect_on_app_finalize, get_current_task


def current_task() -> Any | None:
    """The task this thread is running (a worker's run, a direct call, an eager ``.delay()``)."""
    return get_current_task()


def active_apps() -> list[Any]:
    """Every Celery app of this process."""
    return list(_get_active_apps())


def fallback_app() -> Any:
    """The app Celery makes for a process that made none (``celery._state.default_app``)."""
    return getattr(_state, "default_app", None)


def on_app_finalize(callback: Callable[[Any], None]) -> None:
    """Call ``callback(app)`` when any app, existing or future, is finalized (idempotent)."""
    connect_on_app_finalize(callback)


def evaluate(proxy: Any) -> Any:
    """The task a ``celery.local.Proxy`` (what ``@shared_task`` returns) stands for."""
    return proxy._get_current_object()


# ---- Celery private API: end ----------------------------------------------------------------


# ---- Celery private API (2): the function behind a task not evaluated yet --------------------
# celery.local.Proxy keeps what it evaluates in name-mangled slots: `_Proxy__local` (the callable)
# and `_Proxy__args` / `_Proxy__kwargs` (its arguments). `@app.task` on an app not finalized
# returns a PromiseProxy of `app._task_from_fun` with args `(fun,)` and the task's options;
# `@shared_task` returns a Proxy of a closure `task_by_cons` over `fun` (checked: 5.4.0, 5.7.0).


def task_function(target: Any) -> tuple[Callable[..., Any] | None, dict[str, Any]]:
    """The function the task ``target`` (a task, or a proxy not evaluated yet) was made from, and
    the task options when they can be read (``bind``...); ``(None, {})`` when they cannot."""
    from celery.app.task import Task

    if issubclass(type(target), Task):  # not isinstance(): it would evaluate a proxy
        made = type(target).__dict__.get("_decorated_fun")
        fun = getattr(made, "__func__", made)
        return (fun if callable(fun) else None), {}
    try:
        local = object.__getattribute__(target, "_Proxy__local")
        args = object.__getattribute__(target, "_Proxy__args")
        kwargs = object.__getattribute__(target, "_Proxy__kwargs")
    except AttributeError:
        return None, {}
    if args and callable(args[0]) and getattr(local, "__name__", "") == "_task_from_fun":
        return args[0], dict(kwargs)
    code = getattr(local, "__code__", None)
    closure = local.__closure__ or ()
    cells = dict(zip(code.co_freevars, closure, strict=False)) if code is not None else {}
    fun = cells["fun"].cell_contents if "fun" in cells else None
    return (fun if callable(fun) else None), {}
