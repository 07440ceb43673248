"""django.tasks' uniqueness at enqueue time (SPEC section 14): ``enqueue_unique(task, ...)``
refuses a second message with the same rendered key while the first is queued (and, under
``until="finished"``, running); the function runs under ``@unique_task``, which takes the
enqueue-time lease over when the run starts.

django.tasks' backends choose the result id at the enqueue, after the key must be taken, so the
lease's owner id derives from a random nonce (:func:`django_locks.unique.owner_for`) that
:func:`enqueue_unique` passes in the task's kwargs as ``_django_locks_unique`` together with the
rendered key and ``until`` (so the worker neither re-renders the key nor needs the options):
``{"nonce": "...", "key": "...", "until": "finished"}``. Nothing secret travels. The wrapper
:func:`unique_task` puts under ``@task()`` strips that kwarg before calling the function; a run
without it (a plain ``task.enqueue()``, a direct call) just runs.

Options: ``unique_task(key=, until=, ttl=)`` may give a task's defaults, ``enqueue_unique(...,
key=, until=, ttl=)`` each call's; an option given to neither is ``key=None`` (the default key,
``<task module path>:<sha256 of the canonical JSON of the arguments>``), ``until="finished"``,
and ``ttl`` required.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from django_locks import durations
from django_locks.contrib import tasks_compat
from django_locks.holders import working_on
from django_locks.keys import check_template, validate_key
from django_locks.lock import Lock
from django_locks.unique import (
    UNTILS,
    UniqueSpec,
    arguments_json,
    claim,
    take_over,
    unclaim,
    unique_spec,
)

PAYLOAD = "_django_locks_unique"
"""The kwarg :func:`enqueue_unique` adds to the task's kwargs, and ``@unique_task`` strips."""

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__django_locks_unique__"


@dataclasses.dataclass(frozen=True)
class _Defaults:
    """What ``unique_task(...)`` was given (checked), for :func:`enqueue_unique` to fall back on."""

    func: Callable[..., Any]
    key: str | None
    until: str | None
    ttl: object
    wrapper: Callable[..., Any] | None = None
    """The function ``@unique_task`` made (``functools.wraps`` copies this mark onto a
    decorator's wrapper above it, which is not the one that strips the kwarg)."""


def unique_task(
    func: F | None = None,
    *,
    key: str | None = None,
    until: str | None = None,
    ttl: object = None,
) -> Any:
    """Make a django.tasks function able to be enqueued with :func:`enqueue_unique`: placed
    *under* ``@task()`` (``@task()``, then ``@unique_task``, then the ``def``), it strips the
    ``_django_locks_unique`` kwarg and takes the enqueue-time lease over when the run starts.

    Used bare (``@unique_task``) or with the task's defaults for :func:`enqueue_unique`
    (``@unique_task(key="report:{customer_id}", until="started", ttl="1h")``); each is checked
    here (``TypeError`` / ``ValueError`` naming the rule)."""
    if func is None:
        return lambda f: unique_task(f, key=key, until=until, ttl=ttl)
    if tasks_compat.is_task(func):
        raise _above_the_task(func)
    if not callable(func):
        raise TypeError(f"@unique_task decorates a function, got {type(func).__name__} {func!r}")
    defaults = _check_defaults(func, key, until, ttl)
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def arun(*args: Any, **kwargs: Any) -> Any:
            payload = kwargs.pop(PAYLOAD, None)
            if payload is None:
                return await func(*args, **kwargs)
            from asgiref.sync import sync_to_async

            nonce, spec, rendered = _read(defaults, payload)
            run_id = _run_id(nonce)
            with working_on(run_id):
                taken = await sync_to_async(take_over, thread_sensitive=False)(
                    spec, rendered, nonce, run_id
                )
            if taken is False:
                return None
            if isinstance(taken, Lock):
                from django_locks.context import running_under

                async with taken:
                    with running_under(taken):
                        return await func(*args, **kwargs)
            return await func(*args, **kwargs)

        setattr(arun, _MARK, dataclasses.replace(defaults, wrapper=arun))
        return arun

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        payload = kwargs.pop(PAYLOAD, None)
        if payload is None:
            return func(*args, **kwargs)
        nonce, spec, rendered = _read(defaults, payload)
        run_id = _run_id(nonce)
        with working_on(run_id):
            taken = take_over(spec, rendered, nonce, run_id)
        if taken is False:
            return None
        if isinstance(taken, Lock):
            from django_locks.context import running_under

            with taken, running_under(taken):
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    setattr(run, _MARK, dataclasses.replace(defaults, wrapper=run))
    return run


def enqueue_unique(
    task: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    key: str | None = None,
    until: str | None = None,
    ttl: object = None,
) -> Any:
    """``task.enqueue(*args, **kwargs)`` unless a message with the same rendered key is queued
    (or, under ``until="finished"``, running): then ``AlreadyQueuedError`` and nothing is
    enqueued. Returns the backend's ``TaskResult``.

    ``key`` (a key or a template of the function's arguments; default: ``<task module
    path>:<sha256 of the canonical JSON of the arguments>``), ``until`` (``"started"`` or
    ``"finished"``, the default) and ``ttl`` (how long a message that never runs keeps the key;
    required): each not given (None) is ``@unique_task(...)``'s, else the default. One store
    round trip before the backend's enqueue; a failing enqueue gives the key back. ``task``'s
    function must be decorated with ``@unique_task`` right under ``@task()`` (``TypeError``
    otherwise), and its arguments must be JSON values (``TypeError``, nothing written)."""
    defaults = _defaults_of(task)
    args, kwargs = _arguments(args, kwargs)
    spec = _spec(task, defaults, key, until, ttl)
    # A takes_context function's first parameter is the context, which the enqueue does not pass.
    bound = (None, *args) if getattr(task, "takes_context", False) else args
    if spec.template is not None:
        # JSON only, as the default key checks (the database backend stores them as JSON).
        arguments_json(spec.func, bound, kwargs, template_helps=False)
    rendered = spec.key(bound, kwargs)
    nonce = secrets.token_hex(16)
    claim(spec, rendered, nonce)
    payload = {"nonce": nonce, "key": rendered, "until": spec.until}
    try:
        return task.enqueue(*args, **kwargs, **{PAYLOAD: payload})
    except BaseException:
        unclaim(rendered, nonce)
        raise


def try_enqueue_unique(
    task: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    key: str | None = None,
    until: str | None = None,
    ttl: object = None,
) -> Any:
    """:func:`enqueue_unique`, returning ``None`` instead of raising ``AlreadyQueuedError``
    (every other error is raised as there)."""
    from django_locks.exceptions import AlreadyQueuedError

    try:
        return enqueue_unique(task, args, kwargs, key=key, until=until, ttl=ttl)
    except AlreadyQueuedError:
        return None


# Enqueue.


def _defaults_of(task: Any) -> _Defaults:
    """The ``@unique_task`` options of ``task``'s function; ``TypeError`` naming the fix."""
    if not tasks_compat.is_task(task):
        raise TypeError(
            "enqueue_unique() takes a django.tasks Task (what @task() returns), got "
            f"{type(task).__name__} {task!r:.100}"
        )
    func = task.func
    defaults = getattr(func, _MARK, None)
    if isinstance(defaults, _Defaults) and defaults.wrapper is func:
        return defaults
    inner: Any = func
    for _ in range(100):
        marked = getattr(inner, _MARK, None)
        if isinstance(marked, _Defaults) and marked.wrapper is inner:
            raise TypeError(
                f"enqueue_unique(): {task.module_path}'s @unique_task is not right under "
                "@task(): another decorator between them would receive the "
                f"{PAYLOAD!r} kwarg. Put @unique_task directly under @task()."
            )
        inner = getattr(inner, "__wrapped__", None)
        if inner is None:
            break
    raise TypeError(
        f"enqueue_unique() needs {task.module_path} decorated with @unique_task under @task() "
        "(from django_locks.contrib.tasks import unique_task):\n\n"
        f"    @task()\n    @unique_task\n    def {task.name}(...): ...\n\n"
        f"The worker must strip the {PAYLOAD!r} kwarg and take the key over at the run."
    )


def _arguments(args: object, kwargs: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if not isinstance(args, (list, tuple)):
        raise TypeError(
            f"`args` must be a list or tuple of the task's positional arguments, got "
            f"{type(args).__name__} {args!r:.100}"
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(name, str) for name in kwargs):
        raise TypeError(
            "`kwargs` must be a mapping of str argument names to values, or None, got "
            f"{type(kwargs).__name__} {kwargs!r:.100}"
        )
    if PAYLOAD in kwargs:
        raise TypeError(f"`kwargs` may not hold {PAYLOAD!r}: enqueue_unique() adds it itself")
    return tuple(args), dict(kwargs)


def _check_defaults(func: Callable[..., Any], key: object, until: object, ttl: object) -> _Defaults:
    """``unique_task``'s options, each checked on its own (``ttl`` may come at the enqueue)."""
    if key is not None:
        if not isinstance(key, str):
            raise TypeError(f"`key` must be a str (a key or a template) or None, got {key!r}")
        validate_key(key, name="key")
        check_template(key, func)
    if until is not None and (not isinstance(until, str) or until not in UNTILS):
        error = ValueError if isinstance(until, str) else TypeError
        raise error(f"`until` must be 'started', 'finished' or None, got {until!r}")
    if ttl is not None:
        durations.ttl_ms(ttl)  # type: ignore[arg-type]
    return _Defaults(func=func, key=key, until=until, ttl=ttl)


def _spec(task: Any, defaults: _Defaults, key: object, until: object, ttl: object) -> UniqueSpec:
    # None: not given for this call, so the task's (unique_task's), else the default.
    if key is None:
        key = defaults.key
    if until is None:
        until = defaults.until or "finished"
    if ttl is None:
        ttl = defaults.ttl
    return unique_spec(defaults.func, task.module_path, key=key, until=until, ttl=ttl)


# Run.


def _read(defaults: _Defaults, payload: object) -> tuple[str, UniqueSpec, str]:
    """The nonce, the spec the run needs and the rendered key, from the kwarg's value."""
    if not isinstance(payload, Mapping):
        raise TypeError(f"{PAYLOAD!r} must be the mapping enqueue_unique() passes, got {payload!r}")
    nonce, key, until = payload.get("nonce"), payload.get("key"), payload.get("until")
    if not isinstance(nonce, str) or not nonce or not isinstance(key, str) or until not in UNTILS:
        raise ValueError(
            f"{PAYLOAD!r} must hold the str 'nonce' and 'key' and an 'until' of "
            f"{UNTILS} that enqueue_unique() passes, got {payload!r:.200}"
        )
    func = defaults.func
    name = f"{func.__module__}.{func.__qualname__}"
    # ttl_ms is the enqueue's; the run holds the key on the service's ttl (take_over).
    spec = UniqueSpec(name=name, func=func, template=None, until=until, ttl_ms=0)
    return nonce, spec, key


def _run_id(nonce: str) -> str:
    """The id of the task result being run, as ``task_started`` told it
    (:func:`django_locks.contrib.tasks.current_task_result`); the nonce when the backend sent no
    signal, or the result running is another message."""
    from django_locks.contrib.tasks import current_task_result

    result = current_task_result()
    if result is not None:
        kwargs = getattr(result, "kwargs", None) or {}
        payload = kwargs.get(PAYLOAD) if isinstance(kwargs, Mapping) else None
        if isinstance(payload, Mapping) and payload.get("nonce") == nonce:
            return str(result.id)
    return nonce


def _above_the_task(target: Any) -> TypeError:
    name = getattr(target, "module_path", None) or repr(target)
    return TypeError(
        f"@unique_task is placed above @task() on {name}: it received the django.tasks Task, "
        "not the function, and the worker would run the function without it. Put @task() "
        "first (outermost), then @unique_task, then the def:\n\n"
        f"    @task()\n    @unique_task\n    def {getattr(target, 'name', 'job')}(...): ..."
    )
