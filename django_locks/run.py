"""How a decorated job's call runs: the owner lease checked, the run lock held, the run skipped.

One protocol, its I/O steps yielded to a sync or an async driver, with the owner lease's policy in
front: sticky for functions, per run and kept until ``min_hold`` for management commands, none for
a Celery task (beat enforces it).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable, Generator
from typing import Any

from django.core.management.base import CommandError

from django_locks import conflicts
from django_locks.context import running_under
from django_locks.exceptions import LockNotAcquiredError
from django_locks.holders import Holder
from django_locks.job import JobSpec
from django_locks.lock import Lock
from django_locks.on_commit import commit_alias, refuse_several
from django_locks.ownership import ELSEWHERE, log_owner, skipped, sticky
from django_locks.protocol import CALL, Acquire, LeaveFor, Release, Step, Steps, adrive, drive

logger = logging.getLogger("django_locks")

# Who is calling: a Celery task being run (by a worker, a direct call, .delay() made eager)?
# Asked of the Celery seam once Celery is imported (a process that has not imported it runs no
# Celery task): found here on first use, never set from elsewhere at import.

TaskNameHook = Callable[[Callable[..., Any]], "str | None"]
_task_name_hook: TaskNameHook | None = None


def set_task_name_hook(hook: TaskNameHook) -> None:
    """Answer "which task runs ``wrapper``?" with ``hook`` instead of asking Celery (nothing in
    the package calls it any more: the Celery seam is found on first use)."""
    global _task_name_hook
    _task_name_hook = hook


def _task_name(wrapper: Callable[..., Any]) -> str | None:
    """The Celery task name when ``wrapper`` runs as the current task's body, else None."""
    global _task_name_hook
    hook = _task_name_hook
    if hook is None:
        if "celery" not in sys.modules:
            return None
        hook = _task_name_hook = importlib.import_module(
            "django_locks.contrib.celery"
        ).current_task_name
    return hook(wrapper)


def _tasks_run(wrapper: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """The django.tasks run ``wrapper`` makes (``django_locks.contrib.tasks.TaskRun``), else
    None: asked of the django.tasks seam, imported by ``ready()`` where django.tasks is."""
    seam = sys.modules.get("django_locks.contrib.tasks")
    return None if seam is None else seam.task_run(wrapper, kwargs)


def _locks() -> Any:
    from django_locks.service import locks

    return locks


def _link(owner: Lock | None, run: Lock) -> Callable[[], None]:
    """Abort the run lock's signal when the owner lease is lost; return the unlinking call."""
    if owner is None:
        return lambda: None

    def propagate(signal: Any) -> None:
        run.signal.abort(signal.reason)

    owner.signal.add_callback(propagate)
    return lambda: owner.signal.remove_callback(propagate)


# The run protocol (django_locks.protocol): a generator of the steps that need I/O. The
# policies in front (a sticky owner lease, a per-run one kept for min_hold, none for a Celery
# task) are generators too, ending in the same run-lock steps.


def _ttl_ms(locks: Any, ttl_ms: int | None) -> int:
    return locks.ttl_ms if ttl_ms is None else ttl_ms


def _run_lock_steps(
    spec: JobSpec,
    locks: Any,
    owner: Lock | None,
    run_key: str | None,
    skip: conflicts.Skip,
    label: str = "",
    task: str | None = None,
    task_run: Any = None,
) -> Generator[Step, Any, tuple[bool, Any]]:
    """The call under the run lock ``run_key`` (linked to ``owner``), or under ``owner`` when
    the job has no run lock: ``(True, result)``; ``(False, None)`` when the run lock is held
    elsewhere and the run was skipped (``skip(run_key, holder, reason)`` was told). What a
    run that finds it held does is its ``on_conflict`` (``django_locks.conflicts``); ``task``:
    the Celery task this call runs as (None: not a task); ``task_run``: the django.tasks run it
    makes (None: not one)."""
    if run_key is None:
        if owner is None:
            return True, (yield CALL)
        with running_under(owner):
            return True, (yield CALL)
    run = spec.run
    assert run is not None
    if run.on_conflict == "replace":
        conflicts.check_replace_store(locks.store)
    ttl_ms = _ttl_ms(locks, run.ttl_ms)
    max_hold_ms = locks.max_hold_ms if run.max_hold_ms is None else run.max_hold_ms
    wait_s = conflicts.first_wait_s(run)
    alias = commit_alias(locks.store, run.using) if run.on_commit else None
    if alias is not None:
        refuse_several(alias, run_key)
    tried = Acquire(run_key, ttl_ms, label, "run", run.permits, wait_s, max_hold_ms)
    lock = yield tried
    if not isinstance(lock, Lock):
        name = task or spec.name
        try:
            lock = yield from conflicts.resolve(
                run, tried, lock, name=name, task=task, skip=skip, task_run=task_run
            )
        except LockNotAcquiredError as error:
            if spec.is_command:
                # One line on stderr and exit 1, as Django prints a CommandError, not a
                # traceback in the cron mail; the error is its __cause__.
                raise CommandError(str(error)) from error
            raise
        if lock is None:
            return False, None
    unlink = _link(owner, lock)
    failed = True
    try:
        with running_under(lock):
            result = yield CALL
        failed = False
        return True, result
    finally:
        unlink()
        yield Release(lock, alias, failed)


def _owner_acquire(spec: JobSpec, locks: Any, key: str, label: str) -> Acquire:
    """The owner lease's one try: its own ttl and max_hold (never ``LOCKS["MAX_HOLD"]``)."""
    assert spec.once is not None
    ttl_ms = _ttl_ms(locks, spec.once.ttl_ms)
    return Acquire(key, ttl_ms, label, "owner", max_hold_ms=spec.once.max_hold_ms)


def _function_steps(
    spec: JobSpec,
    locks: Any,
    task: str | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    task_run: Any = None,
) -> Steps:
    """A function's call: its sticky owner lease (not as a Celery task: beat enforces that;
    never as a django.tasks run, refused), taken once and then checked without a store call;
    then the run lock."""
    if task_run is not None and spec.once is not None:
        from django_locks.contrib.tasks import refuse_on_one_instance

        raise refuse_on_one_instance(spec.name)
    owner: Lock | None = None
    if spec.once is not None and task is None:
        key = spec.owner_key(args, kwargs, None)
        owner = sticky.held(key)
        if owner is None:
            label = spec.owner_template()
            found = yield _owner_acquire(spec, locks, key, label)
            if not isinstance(found, Lock):
                skipped(spec.name, key, ELSEWHERE, holder=found, level=logging.DEBUG, label=label)
                return None
            owner = found
            sticky.keep(spec.name, owner)
    run_key = spec.run_key(args, kwargs, task) if spec.run is not None else None
    run_label = spec.run_template(task) if spec.run is not None else ""

    def skip(key: str, holder: Holder | None, reason: str) -> None:
        skipped(task or spec.name, key, reason, holder=holder, label=run_label)

    _, result = yield from _run_lock_steps(
        spec, locks, owner, run_key, skip, run_label, task, task_run
    )
    return result


def _command_steps(
    spec: JobSpec, locks: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Steps:
    """A command's run: the owner lease per run, kept until ``min_hold`` after the run's start
    (a run that raises or is skipped hands it back at once); then the run lock."""
    from django_locks import conf

    command = args[0] if args else None
    started = locks.clock.monotonic()
    owner: Lock | None = None
    if spec.once is not None:
        key = spec.owner_key(args, kwargs, None)
        label = spec.owner_template()
        found = yield _owner_acquire(spec, locks, key, label)
        if not isinstance(found, Lock):
            _command_skipped(spec, command, key, ELSEWHERE, found, "its hold ends", label)
            return None
        owner = found
        log_owner(spec.name, owner)

    run_label = spec.run_template() if spec.run is not None else ""

    def skip(key: str, holder: Holder | None, reason: str) -> None:
        _command_skipped(spec, command, key, reason, holder, "its lease expires", run_label)

    try:
        run_key = spec.run_key(args, kwargs, None) if spec.run is not None else None
        ran, result = yield from _run_lock_steps(spec, locks, owner, run_key, skip, run_label)
    except BaseException:
        # A run that raises releases at once: the next tick, anywhere, may try again.
        if owner is not None:
            yield Release(owner)
        raise
    if owner is None:
        return result
    if not ran:
        yield Release(owner)  # a store error is logged: the skip still exits 0
        return None
    assert spec.once is not None
    min_hold_ms = spec.once.min_hold_ms
    if min_hold_ms is None:
        min_hold_ms = conf.get().min_hold_ms
    remaining_ms = int(min_hold_ms - (locks.clock.monotonic() - started) * 1000)
    if remaining_ms > 0:
        yield LeaveFor(owner, remaining_ms)
    else:
        yield Release(owner)  # never raised over the run's result (SPEC section 10)
    return result


def run_function(
    spec: JobSpec, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """One call of a decorated function: its sticky owner lease (not when it runs as a Celery
    task: beat enforces that; refused as a django.tasks run), then the run lock for the call."""
    task = _task_name(wrapper)
    task_run = _tasks_run(wrapper, kwargs) if task is None else None
    locks = _locks()
    steps = _function_steps(spec, locks, task, args, kwargs, task_run)
    return drive(locks, steps, lambda: spec.func(*args, **kwargs))


async def arun_function(
    spec: JobSpec, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """:func:`run_function` for a coroutine function."""
    task = _task_name(wrapper)
    task_run = _tasks_run(wrapper, kwargs) if task is None else None
    locks = _locks()
    steps = _function_steps(spec, locks, task, args, kwargs, task_run)
    return await adrive(locks, steps, lambda: spec.func(*args, **kwargs))


# Management commands: short-lived runs, one per cron tick on every host.


def run_command(spec: JobSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One run of a decorated command's ``handle()``: the owner lease per run, kept until
    ``min_hold`` after the run's start, and the run lock for the run."""
    locks = _locks()
    return drive(
        locks, _command_steps(spec, locks, args, kwargs), lambda: spec.func(*args, **kwargs)
    )


def _command_skipped(
    spec: JobSpec,
    command: Any,
    key: str,
    reason: str,
    holder: Holder | None,
    ends: str,
    label: str,
) -> None:
    """One line on the command's stderr naming the holder and when its hold ends (as the
    failed acquire's answer said, no further store call); exit 0."""
    line = f"Skipped {spec.name} (key {key!r}): {reason} ({holder_text(holder, ends)})."
    stderr = getattr(command, "stderr", None)
    if stderr is not None:
        stderr.write(line)
    else:
        print(line, file=sys.stderr)
    skipped(spec.name, key, reason, holder=holder, level=logging.DEBUG, label=label)


def holder_text(holder: Holder | None, ends: str = "its hold ends") -> str:
    """ "held by web-2 pid 4121 (command report) since 12:02:35 UTC, its hold ends in 27s
    (2026-12-01 12:03:05 UTC)", from the holder a failed acquire named."""
    import datetime

    if holder is None:
        return "held by another instance"
    text = f"held by {holder}"
    if holder.since is not None:
        text += f" since {holder.since.astimezone(datetime.UTC):%H:%M:%S} UTC"
    if holder.expires_at is not None:
        at = holder.expires_at.astimezone(datetime.UTC)
        seconds = max((at - datetime.datetime.now(datetime.UTC)).total_seconds(), 0.0)
        text += f", {ends} in {seconds:.0f}s ({at:%Y-%m-%d %H:%M:%S} UTC)"
    return text
