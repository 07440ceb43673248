"""How a job decorator's arguments become ONE wrapper around the original function.

``on_one_instance``, ``without_overlapping`` and ``limit_concurrency`` (django_locks.decorators)
check their arguments into a spec; here a spec is attached to a function, merged with the other
decorator's when they are stacked, handed to the Celery seam for a task object, and wrapped (a
command's ``handle``, a coroutine function, a plain function). The ``Protocol`` types say what a
called decorator is, for type checkers.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, Protocol, TypeVar, cast, overload

from django_locks import conflicts, durations
from django_locks.durations import Duration
from django_locks.job import ATTRIBUTE, JobSpec, OnceSpec, RunSpec
from django_locks.keys import check_template, template_fields, validate_key
from django_locks.on_commit import check_release
from django_locks.run import arun_function, run_command, run_function

P = ParamSpec("P")
R = TypeVar("R")


class JobDecorator(Protocol):
    """What a called decorator (``@without_overlapping("key")``) is, for type checkers: the
    decorated function keeps its parameters, and its result may be ``None`` (a skipped run)."""

    @overload
    def __call__(
        self, target: Callable[P, Coroutine[Any, Any, R]], /
    ) -> Callable[P, Coroutine[Any, Any, R | None]]: ...

    @overload
    def __call__(self, target: Callable[P, R], /) -> Callable[P, R | None]: ...


class KeepingJobDecorator(Protocol):
    """A decorator with ``on_conflict="raise"`` or ``"retry"``, for type checkers: the decorated
    function keeps its parameters and its result (a run that does not run raises)."""

    def __call__(self, target: Callable[P, R], /) -> Callable[P, R]: ...


def run_spec(
    key: str | None,
    ttl: Duration | None,
    max_hold: Duration | None,
    on_conflict: object,
    wait: Duration | None,
    max_retries: object,
    release: object = "on_exit",
    using: object = None,
    *,
    permits: int = 1,
    shared_key: object = False,
) -> RunSpec:
    """The checked arguments of ``without_overlapping`` / ``limit_concurrency``."""
    policy = conflicts.check_on_conflict(on_conflict)
    if not isinstance(shared_key, bool):
        raise TypeError(f"`shared_key` must be True or False, got {shared_key!r}")
    spec = RunSpec(
        key=key,
        ttl_ms=None if ttl is None else durations.ttl_ms(ttl),
        permits=permits,
        max_hold_ms=durations.max_hold_ms(max_hold),
        on_conflict=policy,
        wait_ms=conflicts.check_wait(wait),
        max_retries=conflicts.check_max_retries(max_retries),
        shared_key=shared_key,
        on_commit=check_release(release, using),
        using=cast("str | None", using),
    )
    if policy == "replace":
        conflicts.refuse_replace_backend()
    return spec


def check_key_argument(key: object, *, suffix: str = "") -> None:
    if key is None:
        return
    validate_key(key, suffix=suffix)
    assert isinstance(key, str)
    template_fields(key)


def wrap_job(target: Any, *, once: OnceSpec | None = None, run: RunSpec | None = None) -> Any:
    # Only functions are inspected: reading an attribute of a Celery task proxy would evaluate
    # it (and finalize the Celery app) at import time.
    is_function = issubclass(type(target), types.FunctionType)
    spec = getattr(target, ATTRIBUTE, None) if is_function else None
    if isinstance(spec, JobSpec):
        # The other decorator is already applied: rebuild ONE wrapper around the original.
        if (once and spec.once) or (run and spec.run):
            if once:
                raise TypeError(f"@on_one_instance is applied twice to {spec.name}")
            assert run is not None and spec.run is not None
            if run.decorator == spec.run.decorator:
                raise TypeError(f"@{run.decorator} is applied twice to {spec.name}")
            raise TypeError(
                f"@limit_concurrency and @without_overlapping both hold a run lock: apply one "
                f"of them to {spec.name}"
            )
        spec = dataclasses.replace(spec, once=once or spec.once, run=run or spec.run)
    elif is_function:
        spec = _new_spec(target, once, run)
    else:
        from django_locks.contrib import tasks_compat

        if tasks_compat.is_task(target):
            # A django.tasks Task (the decorator is above @task()): its worker would run the
            # function without the wrapper.
            name = "on_one_instance" if once is not None else run.decorator if run else "?"
            raise tasks_compat.above_the_task(name, target)
        # A Celery task object or proxy (the decorator is above @shared_task / @app.task).
        if "celery" in sys.modules:
            from django_locks.contrib import celery as contrib

            if contrib.is_task(target):
                return contrib.decorate_task(target, lambda fn: wrap_job(fn, once=once, run=run))
        raise TypeError(
            f"on_one_instance / without_overlapping / limit_concurrency decorate functions, "
            f"management command handle() methods and Celery tasks (django.tasks: below "
            f"@task()), got {target!r}"
        )
    for key in (spec.once and spec.once.key, spec.run and spec.run.key):
        if key:
            check_template(key, spec.func)
    if spec.run is not None and spec.run.on_commit and spec.is_async:
        raise TypeError(
            f"@{spec.run.decorator}(release='on_commit') cannot decorate the coroutine function "
            f"{spec.name}: Django has no async transaction.atomic(), so its run ends inside no "
            "transaction whose commit could release the run lock. Decorate a synchronous "
            "function (run it under sync_to_async), or leave release='on_exit'."
        )
    if spec.run is not None:
        conflicts.refuse_retry_for_commands(spec.name, spec.is_command, spec.run.on_conflict)
    spec.claim()
    return _build(spec)


def _new_spec(func: Callable[..., Any], once: OnceSpec | None, run: RunSpec | None) -> JobSpec:
    module = getattr(func, "__module__", "") or ""
    is_command = ".management.commands." in f".{module}" and func.__qualname__.endswith(
        "Command.handle"
    )
    is_async = inspect.iscoroutinefunction(func)
    if is_command:
        if is_async:
            raise TypeError(f"{module}.{func.__qualname__} must not be async")
        name = module.rsplit(".", 1)[-1]
        default_key = name
    else:
        name = default_key = f"{module}.{func.__name__}"
    return JobSpec(func, name, default_key, is_command, is_async, once, run)


def _build(spec: JobSpec) -> Callable[..., Any]:
    func = spec.func
    if spec.is_command:

        @functools.wraps(func)
        def command_wrapper(*args: Any, **kwargs: Any) -> Any:
            return run_command(spec, args, kwargs)

        wrapper: Callable[..., Any] = command_wrapper
    elif spec.is_async:

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await arun_function(spec, async_wrapper, args, kwargs)

        wrapper = async_wrapper
    else:

        @functools.wraps(func)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            return run_function(spec, sync_wrapper, args, kwargs)

        wrapper = sync_wrapper
    setattr(wrapper, ATTRIBUTE, spec)
    return wrapper
