"""How a decorated job's call runs: the owner lease checked, the run lock held, the run skipped.

One protocol for sync and async functions (a sticky owner lease) and one for management commands
(the owner lease per run, kept until ``min_hold`` after the run's start).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any, cast

from django_locks import signals
from django_locks.context import running_under
from django_locks.exceptions import LocksError, StoreError
from django_locks.job import JobSpec
from django_locks.lock import Lock, release_failed
from django_locks.ownership import keep, log_owner, owned

logger = logging.getLogger("django_locks")

ELSEWHERE = "it runs on another instance"
"""The ``reason`` of ``run_skipped`` when another process owns the job."""
IN_PROGRESS = "a run is still in progress"
"""The ``reason`` of ``run_skipped`` when the run lock is held."""

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


def run_function(
    spec: JobSpec, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """One call of a decorated function: its sticky owner lease (not when it runs as a Celery
    task: beat enforces that), then the run lock for the call."""
    task = _task_name(wrapper)
    locks = _locks()
    owner: Lock | None = None
    if spec.once is not None and task is None:
        key = spec.owner_key(args, kwargs, None)
        owner = owned(key)
        if owner is None:
            owner = locks.acquire(key, ttl=_seconds(spec.once.ttl_ms))
            if owner is None:
                skipped(spec.name, key, ELSEWHERE, level=logging.DEBUG)
                return None
            keep(spec.name, key, owner)
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


async def arun_function(
    spec: JobSpec, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """:func:`run_function` for a coroutine function."""
    task = _task_name(wrapper)
    locks = _locks()
    owner: Lock | None = None
    if spec.once is not None and task is None:
        key = spec.owner_key(args, kwargs, None)
        owner = owned(key)
        if owner is None:
            owner = await locks.aacquire(key, ttl=_seconds(spec.once.ttl_ms))
            if owner is None:
                skipped(spec.name, key, ELSEWHERE, level=logging.DEBUG)
                return None
            keep(spec.name, key, owner)
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


def run_command(spec: JobSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One run of a decorated command's ``handle()``: the owner lease per run, kept until
    ``min_hold`` after the run's start, and the run lock for the run."""
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
        log_owner(spec.name, owner)
    try:
        lock: Lock | None = None
        if spec.run is not None:
            run_key = spec.run_key(args, kwargs, None)
            lock = locks.acquire(run_key, ttl=_seconds(spec.run.ttl_ms))
            if lock is None:
                _command_skipped(spec, command, run_key, IN_PROGRESS, "its lease expires")
                if owner is not None:
                    _release(owner)  # a store error is logged: the skip still exits 0
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
            _release(owner)  # never raised over the run's result (SPEC section 10)
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
    """ "held by host:pid, its hold ends in 27s (12:03:05 UTC)", from the store's ``lease(key)``."""
    import datetime

    try:
        lease = _locks().store.lease(key)
    except (NotImplementedError, LocksError):
        return "held by another instance"
    if lease is None or lease.state != "held":
        return "held by another instance, which just let it go"
    text = f"held by {lease.holder}"
    if lease.expires_in is not None:
        seconds = max(lease.expires_in.total_seconds(), 0.0)
        at = datetime.datetime.now(datetime.UTC) + lease.expires_in
        text += f", {ends} in {seconds:.0f}s ({at:%Y-%m-%d %H:%M:%S} UTC)"
    return text
