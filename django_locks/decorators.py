"""``on_one_instance`` and ``without_overlapping``: a job runs on one instance, never over itself.

Both decorate a sync or async function, a management command's ``handle``, or a Celery task (below
or above ``@shared_task`` / ``@app.task``). Stacked, they become ONE wrapper around the original
function whatever their order: the owner lease is checked first, then the run lock is taken, so a
process that does not own the job never touches the run lock. A key given to one of them is the
key of both.

Where ``on_one_instance`` is enforced depends on who calls (SPEC section 5):

* a plain function in a long-lived process keeps a *sticky* owner lease ``<key>:owner``, renewed
  in the background and handed back at exit; while it is held a call costs no round trip;
* a management command takes the owner lease per run and keeps it until ``min_hold`` after the
  run's start, so the same cron tick on another host skips;
* a Celery task is enforced in celery beat (``django_locks.contrib.celery``); a worker, a direct
  call or ``.delay()`` just runs it.

``without_overlapping`` holds the run lock ``<key>`` for the whole run, wherever it runs.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib
import inspect
import logging
import sys
import threading
import types
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, Protocol, TypeVar, cast, overload

from django_locks import durations, registry, signals
from django_locks.context import running_under
from django_locks.durations import Duration
from django_locks.exceptions import LocksError, StoreError
from django_locks.keys import check_template, render_key, template_fields, validate_key
from django_locks.lock import Lock, release_failed

logger = logging.getLogger("django_locks")

F = TypeVar("F", bound=Callable[..., Any])
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


OWNER_SUFFIX = ":owner"
ELSEWHERE = "it runs on another instance"
"""The ``reason`` of ``run_skipped`` when another process owns the job."""
IN_PROGRESS = "a run is still in progress"
"""The ``reason`` of ``run_skipped`` when the run lock is held."""

ATTRIBUTE = "__django_locks__"
"""The attribute of a decorated function holding its :class:`JobSpec`."""


@dataclasses.dataclass(frozen=True)
class OnceSpec:
    """What ``on_one_instance`` was given."""

    key: str | None
    ttl_ms: int | None
    min_hold_ms: int | None


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What ``without_overlapping`` was given."""

    key: str | None
    ttl_ms: int | None


@dataclasses.dataclass
class JobSpec:
    """A decorated job: the original function and the decorators applied to it.

    ``default_key`` is ``module.function`` (Celery's default task name) or the command's name; a
    Celery task named otherwise uses its task name (``django_locks.contrib.celery`` passes it).
    """

    func: Callable[..., Any]
    name: str
    default_key: str
    is_command: bool
    is_async: bool
    once: OnceSpec | None = None
    run: RunSpec | None = None

    def owner_template(self, default: str | None = None) -> str:
        """The key template of the owner lease (without ``:owner``)."""
        assert self.once is not None
        return self.once.key or (self.run and self.run.key) or default or self.default_key

    def run_template(self, default: str | None = None) -> str:
        assert self.run is not None
        return self.run.key or (self.once and self.once.key) or default or self.default_key

    def owner_key(self, args: tuple[Any, ...], kwargs: dict[str, Any], default: str | None) -> str:
        """The owner lease key of one call (``<key>:owner``)."""
        key = render_key(self.owner_template(default), self.func, args, kwargs)
        return validate_key(key, suffix=OWNER_SUFFIX)

    def run_key(self, args: tuple[Any, ...], kwargs: dict[str, Any], default: str | None) -> str:
        """The run lock key of one call."""
        return validate_key(render_key(self.run_template(default), self.func, args, kwargs))

    def claim(self, default: str | None = None) -> None:
        """Claim this job's keys in the registry (refusing another job's), forgetting old ones."""
        job = registry.job_for(self.func, kind="job", key=self.default_key)
        registry.unclaim(job)
        names: list[str] = []
        if self.once is not None:
            key = self.owner_template(default)
            names += [key, key + OWNER_SUFFIX]
        if self.run is not None:
            names.append(self.run_template(default))
        job = registry.job_for(self.func, kind="job", key=names[0])
        registry.claim(job, *dict.fromkeys(names))


@overload
def on_one_instance(
    key: Callable[P, Coroutine[Any, Any, R]], /
) -> Callable[P, Coroutine[Any, Any, R | None]]: ...


@overload
def on_one_instance(key: Callable[P, R], /) -> Callable[P, R | None]: ...


@overload
def on_one_instance(
    key: str | None = None,
    *,
    ttl: Duration | None = None,
    min_hold: Duration | None = None,
) -> JobDecorator: ...


def on_one_instance(
    key: str | Callable[..., Any] | None = None,
    *,
    ttl: Duration | None = None,
    min_hold: Duration | None = None,
) -> Any:
    """Run the decorated job on one instance: the owner of the lease ``<key>:owner``.

    ``key``: the job's key, or a template formatted from the call's arguments
    (``"report:{customer_id}"``); default: the task's name, ``module.function`` or the command's
    name. ``ttl``: the owner lease's ttl (default ``LOCKS["TTL"]``): after the owner dies, another
    instance takes over within it. ``min_hold``: management commands only, how long after a run's
    start the lease stays taken (default ``LOCKS["MIN_HOLD"]``), so the same cron tick elsewhere
    skips. A skipped call logs, sends ``run_skipped`` and returns ``None``.
    Usable bare (``@on_one_instance``) or called.
    """
    if callable(key):
        return on_one_instance()(key)
    _check_key_argument(key, suffix=OWNER_SUFFIX)
    spec = OnceSpec(
        key=key,
        ttl_ms=None if ttl is None else durations.ttl_ms(ttl),
        min_hold_ms=None if min_hold is None else durations.min_hold_ms(min_hold),
    )

    def decorate(target: F) -> F:
        return cast(F, _decorate(target, once=spec))

    return decorate


@overload
def without_overlapping(
    key: Callable[P, Coroutine[Any, Any, R]], /
) -> Callable[P, Coroutine[Any, Any, R | None]]: ...


@overload
def without_overlapping(key: Callable[P, R], /) -> Callable[P, R | None]: ...


@overload
def without_overlapping(key: str | None = None, *, ttl: Duration | None = None) -> JobDecorator: ...


def without_overlapping(
    key: str | Callable[..., Any] | None = None, *, ttl: Duration | None = None
) -> Any:
    """Never run the decorated job while a run of it holds the run lock ``<key>``, anywhere.

    ``key`` as for :func:`on_one_instance`; ``ttl``: the run lock's ttl (default
    ``LOCKS["TTL"]``), renewed for the whole run. Inside the run, ``current_lock()`` is the run
    lock, whose fencing token grows with every run. A run that finds the lock held is skipped:
    logged, ``run_skipped`` sent, ``None`` returned. Usable bare or called.
    """
    if callable(key):
        return without_overlapping()(key)
    _check_key_argument(key)
    spec = RunSpec(key=key, ttl_ms=None if ttl is None else durations.ttl_ms(ttl))

    def decorate(target: F) -> F:
        return cast(F, _decorate(target, run=spec))

    return decorate


def job_spec(func: object) -> JobSpec | None:
    """The :class:`JobSpec` of a decorated function (looking through ``__wrapped__``), or None."""
    seen = 0
    while func is not None and seen < 100:
        func = getattr(func, "__func__", func)
        spec = getattr(func, ATTRIBUTE, None)
        if isinstance(spec, JobSpec):
            return spec
        func = getattr(func, "__wrapped__", None)
        seen += 1
    return None


def _check_key_argument(key: object, *, suffix: str = "") -> None:
    if key is None:
        return
    validate_key(key, suffix=suffix)
    assert isinstance(key, str)
    template_fields(key)


def _decorate(target: Any, *, once: OnceSpec | None = None, run: RunSpec | None = None) -> Any:
    # Only functions are inspected: reading an attribute of a Celery task proxy would evaluate
    # it (and finalize the Celery app) at import time.
    is_function = issubclass(type(target), types.FunctionType)
    spec = getattr(target, ATTRIBUTE, None) if is_function else None
    if isinstance(spec, JobSpec):
        # The other decorator is already applied: rebuild ONE wrapper around the original.
        if (once and spec.once) or (run and spec.run):
            which = "on_one_instance" if once else "without_overlapping"
            raise TypeError(f"@{which} is applied twice to {spec.name}")
        spec = dataclasses.replace(spec, once=once or spec.once, run=run or spec.run)
    elif is_function:
        spec = _new_spec(target, once, run)
    else:
        # A Celery task object or proxy (the decorator is above @shared_task / @app.task).
        if "celery" in sys.modules:
            from django_locks.contrib import celery as contrib

            if contrib.is_task(target):
                return contrib.decorate_task(target, lambda fn: _decorate(fn, once=once, run=run))
        raise TypeError(
            f"on_one_instance / without_overlapping decorate functions, management command "
            f"handle() methods and Celery tasks, got {target!r}"
        )
    for key in (spec.once and spec.once.key, spec.run and spec.run.key):
        if key:
            check_template(key, spec.func)
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
            return _run_command(spec, args, kwargs)

        wrapper: Callable[..., Any] = command_wrapper
    elif spec.is_async:

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await _arun(spec, async_wrapper, args, kwargs)

        wrapper = async_wrapper
    else:

        @functools.wraps(func)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            return _run(spec, sync_wrapper, args, kwargs)

        wrapper = sync_wrapper
    setattr(wrapper, ATTRIBUTE, spec)
    return wrapper


# Who is calling: a Celery task being run (by a worker, a direct call, .delay() made eager)?

TaskNameHook = Callable[[Callable[..., Any]], "str | None"]
_task_name_hook: TaskNameHook | None = None


def set_task_name_hook(hook: TaskNameHook) -> None:
    """``django_locks.contrib.celery`` tells which wrapper runs as the current Celery task."""
    global _task_name_hook
    _task_name_hook = hook


def _task_name(wrapper: Callable[..., Any]) -> str | None:
    """The Celery task name when ``wrapper`` runs as the current task's body, else None."""
    if _task_name_hook is None and "celery" in sys.modules:
        importlib.import_module("django_locks.contrib.celery")
    return _task_name_hook(wrapper) if _task_name_hook is not None else None


def _locks() -> Any:
    from django_locks.service import locks

    return locks


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


# Sticky owner leases of plain functions in this process.

_sticky: dict[str, Lock] = {}
_sticky_mutex = threading.Lock()
_atexit_registered = False


def _owned(key: str) -> Lock | None:
    """The sticky lease on ``key`` if this process still holds it: no store call."""
    lock = _sticky.get(key)
    return lock if lock is not None and lock.held else None


def _keep(spec: JobSpec, key: str, lock: Lock) -> None:
    global _atexit_registered
    with _sticky_mutex:
        _sticky[key] = lock
        if not _atexit_registered:
            atexit.register(release_owner_leases)
            _atexit_registered = True
    _log_owner(spec.name, lock)


def release_owner_leases() -> None:
    """Hand back every sticky owner lease this process holds (at exit, or in tests)."""
    with _sticky_mutex:
        held = list(_sticky.values())
        _sticky.clear()
    for lock in held:
        try:
            lock.release()
        except LocksError as exc:
            logger.warning("Handing back %r failed (%s); it lapses at its ttl", lock.key, exc)


def _log_owner(name: str, lock: Lock) -> None:
    logger.info(
        "%s runs on this instance (lease %r, fencing token %s)",
        name,
        lock.key,
        lock.fencing_token,
    )


def skipped(name: str, key: str, reason: str, *, level: int = logging.INFO) -> None:
    """Log a skipped run and send ``run_skipped``."""
    from django_locks.service import Locks

    logger.log(level, "Skipped %s: %s", name, reason)
    signals.send(signals.run_skipped, Locks, key=key, reason=reason)


def _link(owner: Lock | None, run: Lock) -> Callable[[], None]:
    """Abort the run lock's signal when the owner lease is lost; return the unlinking call."""
    if owner is None:
        return lambda: None

    def propagate(signal: Any) -> None:
        run.signal.abort(signal.reason)

    owner.signal.add_callback(propagate)
    return lambda: owner.signal.remove_callback(propagate)


def _release(lock: Lock) -> None:
    """Release a run's lock: a store failure is logged, never raised over the run's result or
    exception (the lease lapses at its ttl)."""
    try:
        lock.release()
    except StoreError as error:
        release_failed(lock, error)


async def _arelease(lock: Lock) -> None:
    """:func:`_release` for async runs: it completes whatever the cancellation, so that the
    next run finds the key free (see ``Lock.arelease``)."""
    try:
        await lock.arelease()
    except StoreError as error:
        release_failed(lock, error)


def _run(
    spec: JobSpec, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    task = _task_name(wrapper)
    locks = _locks()
    owner: Lock | None = None
    if spec.once is not None and task is None:
        key = spec.owner_key(args, kwargs, None)
        owner = _owned(key)
        if owner is None:
            owner = locks.acquire(key, ttl=_seconds(spec.once.ttl_ms))
            if owner is None:
                skipped(spec.name, key, ELSEWHERE, level=logging.DEBUG)
                return None
            _keep(spec, key, owner)
    if spec.run is None:
        if owner is None:
            return spec.func(*args, **kwargs)
        with running_under(owner):
            return spec.func(*args, **kwargs)
    run_key = spec.run_key(args, kwargs, task)
    lock = locks.acquire(run_key, ttl=_seconds(spec.run.ttl_ms))
    if lock is None:
        skipped(task or spec.name, run_key, IN_PROGRESS)
        return None
    unlink = _link(owner, lock)
    try:
        with running_under(lock):
            return spec.func(*args, **kwargs)
    finally:
        unlink()
        _release(lock)


async def _arun(
    spec: JobSpec, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    task = _task_name(wrapper)
    locks = _locks()
    owner: Lock | None = None
    if spec.once is not None and task is None:
        key = spec.owner_key(args, kwargs, None)
        owner = _owned(key)
        if owner is None:
            owner = await locks.aacquire(key, ttl=_seconds(spec.once.ttl_ms))
            if owner is None:
                skipped(spec.name, key, ELSEWHERE, level=logging.DEBUG)
                return None
            _keep(spec, key, owner)
    if spec.run is None:
        if owner is None:
            return await spec.func(*args, **kwargs)
        with running_under(owner):
            return await spec.func(*args, **kwargs)
    run_key = spec.run_key(args, kwargs, task)
    lock = await locks.aacquire(run_key, ttl=_seconds(spec.run.ttl_ms))
    if lock is None:
        skipped(task or spec.name, run_key, IN_PROGRESS)
        return None
    unlink = _link(owner, lock)
    try:
        with running_under(lock):
            return await spec.func(*args, **kwargs)
    finally:
        unlink()
        await _arelease(lock)


# Management commands: short-lived runs, one per cron tick on every host.


def _run_command(spec: JobSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from django_locks import conf

    command = args[0] if args else None
    locks = _locks()
    started = locks.clock.monotonic()
    owner: Lock | None = None
    if spec.once is not None:
        key = spec.owner_key(args, kwargs, None)
        owner = locks.acquire(key, ttl=_seconds(spec.once.ttl_ms))
        if owner is None:
            _command_skipped(spec, command, key, ELSEWHERE, "its hold ends")
            return None
        _log_owner(spec.name, owner)
    try:
        lock: Lock | None = None
        if spec.run is not None:
            run_key = spec.run_key(args, kwargs, None)
            lock = locks.acquire(run_key, ttl=_seconds(spec.run.ttl_ms))
            if lock is None:
                _command_skipped(spec, command, run_key, IN_PROGRESS, "its lease expires")
                if owner is not None:
                    owner.release()
                return None
        unlink = _link(owner, lock) if lock is not None else (lambda: None)
        try:
            with running_under(lock or cast(Lock, owner)):
                result = spec.func(*args, **kwargs)
        finally:
            unlink()
            if lock is not None:
                _release(lock)
    except BaseException:
        # A run that raises releases at once: the next tick, anywhere, may try again.
        if owner is not None:
            _release(owner)
        raise
    if owner is not None:
        assert spec.once is not None
        min_hold_ms = spec.once.min_hold_ms
        if min_hold_ms is None:
            min_hold_ms = conf.get().min_hold_ms
        remaining_ms = int(min_hold_ms - (locks.clock.monotonic() - started) * 1000)
        if remaining_ms > 0:
            _hold_and_leave(owner, remaining_ms)
        else:
            owner.release()
    return result


def _hold_and_leave(lock: Lock, remaining_ms: int) -> None:
    """Leave ``lock``'s lease in the store for ``remaining_ms`` more, then let it lapse.

    The process is about to exit: renewals stop first (without I/O), then ONE renewal moves the
    store's expiry to the end of ``min_hold``, so the lease outlives the process without anybody
    renewing it.
    """
    try:
        lock.leave_for(remaining_ms / 1000)
    except StoreError as exc:
        logger.warning("Keeping %r for min_hold failed (%s); it lapses at its ttl", lock.key, exc)


def _command_skipped(spec: JobSpec, command: Any, key: str, reason: str, ends: str) -> None:
    """One line on the command's stderr naming the holder and when its hold ends; exit 0."""
    line = f"Skipped {spec.name}: {reason} ({holder_text(key, ends)})."
    stderr = getattr(command, "stderr", None)
    if stderr is not None:
        stderr.write(line)
    else:
        print(line, file=sys.stderr)
    skipped(spec.name, key, reason, level=logging.DEBUG)


def holder_text(key: str, ends: str = "its hold ends") -> str:
    """ "held by host:pid, its hold ends in 27s (12:03:05 UTC)", from the store's listing."""
    import datetime

    try:
        leases = _locks().store.leases()
    except (NotImplementedError, LocksError):
        return "held by another instance"
    for lease in leases:
        if lease.key == key and lease.state == "held":
            text = f"held by {lease.holder}"
            if lease.expires_in is not None:
                seconds = max(lease.expires_in.total_seconds(), 0.0)
                at = datetime.datetime.now(datetime.UTC) + lease.expires_in
                text += f", {ends} in {seconds:.0f}s ({at:%Y-%m-%d %H:%M:%S} UTC)"
            return text
    return "held by another instance, which just let it go"
