"""Celery: uniqueness at enqueue time (SPEC section 14), the front end of ``django_locks.unique``.

Two forms, one behaviour:

* ``@app.task(base=UniqueTask, unique={"ttl": "1h", "key": ..., "until": ...})`` (or
  ``@shared_task(base=UniqueTask, unique=...)``, or a class-based task with a ``unique``
  attribute): the options are checked when Celery builds the task class
  (``UniqueTask.__init_subclass__``), so bad ones fail at the decorator's line;
* ``@unique(key=None, *, until="finished", ttl)`` placed *above* ``@shared_task`` /
  ``@app.task``: the task's class gets the same ``apply_async`` and ``run``, once the app is
  finalized (at once when it is). Below the task decorator it is a ``TypeError`` naming the order.

**Enqueue** (``apply_async``, so ``delay``, signatures and the first task of a chain): the task
id is chosen before publishing (the caller's ``task_id=``, else a uuid4); the rendered key is
claimed for that id (``unique.claim``: one store round trip, ``AlreadyQueuedError`` while another
message holds it, nothing published); the key and ``until`` travel in the message header
``django_locks_unique``; a publish that raises gives the key back. ``app.send_task`` by name does
not come here: its message has no header and its run is not unique.

**Run** (the task class's ``run``, wrapped): with the header, the run takes the lease over
(``unique.take_over``, message id = run id = the task id). Under ``until="finished"`` it runs
under that ``Lock`` (``current_lock()``), released when the run returns or raises; on
``celery.exceptions.Retry`` the lease is left, unrenewed, for the enqueue ``ttl`` (the retry's
publish, same task id, has claimed it again), so the retried run takes it back and no other
message of the key is accepted meanwhile. A duplicate (its lease lapsed and a later message
holds the key) is skipped: logged, ``run_skipped(code="duplicate")``, the task succeeds with
``None``. A message without the header (``send_task``, a publisher without django_locks, a direct
call ``task(...)``) just runs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from celery.app.task import Task
from celery.exceptions import Retry
from celery.local import Proxy

from django_locks.context import running_under
from django_locks.contrib import celery_compat
from django_locks.exceptions import StoreError
from django_locks.lock import Lock
from django_locks.unique import UNTILS, UniqueSpec, claim, take_over, unclaim, unique_spec

__all__ = ["HEADER_UNIQUE", "UniqueTask", "unique"]

logger = logging.getLogger("django_locks")

HEADER_UNIQUE = "django_locks_unique"
"""The message header of a unique task's message: ``{"key": <rendered key>, "until": ...}``."""

OPTIONS = ("key", "until", "ttl")
"""The keys of ``UniqueTask``'s ``unique`` option."""

_SPEC = "_django_locks_unique"  # the class attribute holding the task's UniqueSpec
_WRAPPED = "_django_locks_unique_run"  # set on the run() wrapper: never wrapped twice

ORDER = (
    "unique(...) goes above the task decorator: @unique(ttl=...), then @shared_task or "
    "@app.task, then the function (it wraps the task's apply_async and delay); or use "
    "@app.task(base=UniqueTask, unique={'ttl': ...})"
)


def _anything(*args: Any, **kwargs: Any) -> None:
    """Stands for a task function that cannot be read yet (its key template is checked later)."""


# The spec: checked options, a signature without a bound task's `self`.


def _signature_function(func: Callable[..., Any], bound: bool) -> Callable[..., Any]:
    """``func`` as the caller's arguments bind to it: without its first parameter when the task
    is bound (``bind=True``: ``self``, which ``apply_async`` is not given)."""
    if not bound:
        return func
    signature = inspect.signature(func)

    def call(*args: Any, **kwargs: Any) -> None:
        """Only its signature is used."""

    call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[1:]
    )
    call.__qualname__ = getattr(func, "__qualname__", call.__qualname__)
    return call


def _run_of(cls: type) -> tuple[Callable[..., Any], bool] | None:
    """The body of the task class ``cls`` and whether it takes ``self``; None: it has none."""
    raw = inspect.getattr_static(cls, "run", None)
    if isinstance(raw, staticmethod):
        return raw.__func__, False
    if raw is None or raw is Task.run or not callable(raw):
        return None
    return raw, True


def _check_options(options: object, where: str) -> dict[str, Any]:
    if not isinstance(options, Mapping):
        raise TypeError(
            f"{where}: `unique` must be a dict of {', '.join(OPTIONS)} (ttl required), for "
            f"example unique={{'ttl': '1h'}}; got {options!r}"
        )
    unknown = sorted(str(name) for name in options if name not in OPTIONS)
    if unknown:
        raise TypeError(
            f"{where}: `unique` takes {', '.join(OPTIONS)}; unknown {', '.join(map(repr, unknown))}"
        )
    return {"key": None, "until": "finished", "ttl": None, **options}


def _configure(cls: type, options: Mapping[str, Any], where: str) -> UniqueSpec:
    """Check ``options`` against the task class ``cls``; give it its spec and the run wrapper."""
    found = _run_of(cls)
    if found is None:
        raise TypeError(f"{where}: a unique task needs a run() (its body)")
    func, bound = found
    name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
    spec = unique_spec(_signature_function(func, bound), str(name), **options)
    setattr(cls, _SPEC, spec)
    if not getattr(func, _WRAPPED, False):
        cls.run = _wrap_run(func, bound)  # type: ignore[attr-defined]
    return spec


def _spec_of(task: Any) -> UniqueSpec | None:
    """The uniqueness of ``task`` (its spec, named as the app named the task), or None."""
    spec: UniqueSpec | None = getattr(type(task), _SPEC, None)
    if spec is None or spec.name == task.name or not task.name:
        return spec
    spec = dataclasses.replace(spec, name=str(task.name))
    setattr(type(task), _SPEC, spec)
    return spec


# Enqueue.


def _enqueue(
    task: Any,
    publish: Callable[..., Any],
    args: Any,
    kwargs: Any,
    task_id: str | None,
    options: dict[str, Any],
) -> Any:
    spec = _spec_of(task)
    if spec is None:
        return publish(args, kwargs, task_id=task_id, **options)
    key = spec.key(tuple(args or ()), dict(kwargs or {}))
    task_id = task_id or str(uuid.uuid4())
    headers = dict(options.pop("headers", None) or {})
    headers[HEADER_UNIQUE] = {"key": key, "until": spec.until}
    claim(spec, key, task_id)
    try:
        return publish(args, kwargs, task_id=task_id, headers=headers, **options)
    except BaseException:
        unclaim(key, task_id)
        raise


class UniqueTask(Task):  # type: ignore[misc]
    """A Celery task base class: at most one message per rendered key queued (and, with
    ``until="finished"``, running) at once. Give the options as the task option ``unique``:
    ``@app.task(base=UniqueTask, unique={"ttl": "1h"})``, with ``key`` (None: the task name and
    a hash of the arguments; or a template), ``until`` (``"finished"`` or ``"started"``) and
    ``ttl`` (required: how long a message that never runs keeps its key). ``apply_async`` /
    ``delay`` raise ``AlreadyQueuedError`` for a duplicate."""

    unique: Mapping[str, Any] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        options = cls.__dict__.get("unique", cls.unique)
        where = f"task {cls.__dict__.get('name') or cls.__qualname__}"
        if options is None:
            if _run_of(cls) is not None and getattr(cls, _SPEC, None) is None:
                raise TypeError(
                    f"{where}: base=UniqueTask needs the option unique={{'ttl': ...}} "
                    "(and optionally 'key' and 'until')"
                )
            return
        checked = _check_options(options, where)
        if _run_of(cls) is None:  # an abstract base: its subclasses (the tasks) get the spec
            unique_spec(_anything, where, **checked)
        elif "unique" in cls.__dict__ or "run" in cls.__dict__:
            _configure(cls, checked, where)

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> Any:
        """Claim the call's key, then publish (``AlreadyQueuedError``: nothing published)."""
        return _enqueue(self, super().apply_async, args, kwargs, task_id, options)


# The decorator above @shared_task / @app.task.

_pending: list[tuple[Any, dict[str, Any]]] = []
_mutex = threading.Lock()
_hooked = False


def unique(
    key: str | None = None, *, until: str = "finished", ttl: Any = None
) -> Callable[[Any], Any]:
    """Make the Celery task below it unique at enqueue time (see :class:`UniqueTask`); placed
    above ``@shared_task`` / ``@app.task``. Returns the task itself."""
    options = {"key": key, "until": until, "ttl": ttl}

    def decorate(target: Any) -> Any:
        global _hooked
        if not issubclass(type(target), (Task, Proxy)):
            raise TypeError(f"{ORDER}; got {target!r}, which is not a Celery task")
        func, task_options = celery_compat.task_function(target)
        base = task_options.get("base")
        is_task = issubclass(type(target), Task)  # not isinstance(): it evaluates a proxy
        if (is_task and getattr(type(target), _SPEC, None)) or (
            isinstance(base, type) and issubclass(base, UniqueTask)
        ):
            raise TypeError("this task is a UniqueTask already: give its options one way only")
        bound = bool(task_options.get("bind"))
        if is_task:
            found = _run_of(type(target))
            func, bound = found if found is not None else (func, bound)
        checked = _signature_function(func, bound) if func is not None else _anything
        unique_spec(checked, "?", **options)  # bad options fail here, at the decorator
        if is_task:
            _patch(target, options)
            return target
        with _mutex:
            _pending.append((target, options))
            if not _hooked:
                _hooked = True
                celery_compat.on_app_finalize(_on_app_finalize)
        for app in celery_compat.active_apps():
            if app.finalized:
                _patch_pending()
        return target

    return decorate


def _on_app_finalize(app: Any) -> None:
    app.on_after_finalize.connect(_after_finalize, weak=False)


def _after_finalize(sender: Any, **kwargs: Any) -> None:
    _patch_pending()


def _patch_pending() -> None:
    for target, options in list(_pending):
        _patch(celery_compat.evaluate(target), options)


def _patch(task: Any, options: dict[str, Any]) -> None:
    cls = type(task)
    with _mutex:
        if _SPEC in cls.__dict__:
            return
        _configure(cls, options, f"task {task.name}")
        publish = cls.apply_async

        def apply_async(
            self: Any,
            args: Any = None,
            kwargs: Any = None,
            task_id: str | None = None,
            **options: Any,
        ) -> Any:
            return _enqueue(self, functools.partial(publish, self), args, kwargs, task_id, options)

        cls.apply_async = apply_async


# Run.


def _wrap_run(func: Callable[..., Any], bound: bool) -> Callable[..., Any]:
    @functools.wraps(func)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        body = functools.partial(func, self) if bound else func
        return _run(self, body, args, kwargs)

    setattr(run, _WRAPPED, True)
    return run


def _header(request: Any) -> tuple[str, str] | None:
    """The (key, until) of the run's message: a worker has the header as an attribute of the
    request, an eager run in ``request.headers``; None without one (or a malformed one)."""
    value = getattr(request, HEADER_UNIQUE, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(HEADER_UNIQUE)
    if value is None:
        return None
    key = value.get("key") if isinstance(value, Mapping) else None
    until = value.get("until") if isinstance(value, Mapping) else None
    if not isinstance(key, str) or until not in UNTILS:
        logger.warning("Ignoring a malformed %s header %r: running as is", HEADER_UNIQUE, value)
        return None
    return key, str(until)


def _run(task: Any, body: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    spec = _spec_of(task)
    request = task.request
    header = _header(request) if spec is not None else None
    if spec is None or header is None or not request.id:
        return body(*args, **kwargs)
    key, until = header
    if until != spec.until:  # published by another release of the code: do as its claim said
        spec = dataclasses.replace(spec, until=until)  # type: ignore[arg-type]
    taken = take_over(spec, key, str(request.id), str(request.id))
    if taken is False:
        return None
    if taken is True:
        return body(*args, **kwargs)
    try:
        with running_under(taken):
            result = body(*args, **kwargs)
    except Retry:
        _end(taken, lambda: taken.leave_for(f"{spec.ttl_ms}ms"))
        raise
    except BaseException:
        _end(taken, taken.release)
        raise
    _end(taken, taken.release)
    return result


def _end(lock: Lock, how: Callable[[], bool]) -> None:
    """Release (or leave) the run's lease; a store failure is logged, the lease lapses."""
    try:
        how()
    except StoreError:
        logger.warning(
            "Could not give back the unique key %r after the run; it is free again after its ttl",
            lock.key,
            exc_info=True,
        )
