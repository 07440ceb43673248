"""How a decorated job's call runs: the owner lease checked, the run lock held, the run skipped.

One protocol, its I/O steps yielded to a sync or an async driver, with the owner lease's policy in
front: sticky for functions, per run and kept until ``min_hold`` for management commands, none for
a Celery task (beat enforces it).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from django_locks.context import running_under
from django_locks.events import Use
from django_locks.exceptions import StoreError
from django_locks.holders import Holder
from django_locks.job import JobSpec
from django_locks.lock import Lock
from django_locks.ownership import (
    AT_CAPACITY,
    ELSEWHERE,
    IN_PROGRESS,
    log_owner,
    skipped,
    sticky,
)

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


# The run protocol: a generator of the steps that need I/O, whose answers are sent back into
# it. Sync and async runs share it whole; their drivers (below) differ only in how each step
# is done. The policies in front (a sticky owner lease, a per-run one kept for min_hold, none
# for a Celery task) are generators too, ending in the same run-lock steps.


@dataclasses.dataclass(frozen=True)
class Acquire:
    """Try ``key`` once for ``ttl_ms`` (checked values); answered with the Lock or None.
    ``label`` (the job's key template) and ``use`` are the event stream's."""

    key: str
    ttl_ms: int
    label: str
    use: Use
    permits: int = 1


@dataclasses.dataclass(frozen=True)
class Release:
    """Release ``lock`` as leaving its ``with`` block does: a store failure is logged, never
    raised over the run's result or exception (the lease lapses at its ttl); an async release
    completes whatever the cancellation (see ``Lock.arelease``)."""

    lock: Lock


@dataclasses.dataclass(frozen=True)
class LeaveFor:
    """Leave ``lock`` in the store ``ms`` more, then let it lapse (commands: synchronous)."""

    lock: Lock
    ms: int


class Call:
    """Call the job; answered with its result, or its exception thrown in."""


CALL = Call()
Step = Acquire | Release | LeaveFor | Call
Steps = Generator[Step, Any, Any]


def _ttl_ms(locks: Any, ttl_ms: int | None) -> int:
    return locks.ttl_ms if ttl_ms is None else ttl_ms


def _busy(spec: JobSpec) -> str:
    """Why a run that found its run lock taken is skipped."""
    return AT_CAPACITY if spec.run is not None and spec.run.permits > 1 else IN_PROGRESS


def _run_lock_steps(
    spec: JobSpec,
    locks: Any,
    owner: Lock | None,
    run_key: str | None,
    busy: Callable[[str, Holder | None], None],
    label: str = "",
) -> Generator[Step, Any, tuple[bool, Any]]:
    """The call under the run lock ``run_key`` (linked to ``owner``), or under ``owner`` when
    the job has no run lock: ``(True, result)``; ``(False, None)`` when the run lock is held
    elsewhere (``busy(run_key, holder)`` was told)."""
    if run_key is None:
        if owner is None:
            return True, (yield CALL)
        with running_under(owner):
            return True, (yield CALL)
    assert spec.run is not None
    ttl_ms = _ttl_ms(locks, spec.run.ttl_ms)
    lock = yield Acquire(run_key, ttl_ms, label, "run", spec.run.permits)
    if not isinstance(lock, Lock):
        busy(run_key, lock)
        return False, None
    unlink = _link(owner, lock)
    try:
        with running_under(lock):
            return True, (yield CALL)
    finally:
        unlink()
        yield Release(lock)


def _function_steps(
    spec: JobSpec, locks: Any, task: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Steps:
    """A function's call: its sticky owner lease (not as a Celery task: beat enforces that),
    taken once and then checked without a store call; then the run lock."""
    owner: Lock | None = None
    if spec.once is not None and task is None:
        key = spec.owner_key(args, kwargs, None)
        owner = sticky.held(key)
        if owner is None:
            label = spec.owner_template()
            found = yield Acquire(key, _ttl_ms(locks, spec.once.ttl_ms), label, "owner")
            if not isinstance(found, Lock):
                skipped(spec.name, key, ELSEWHERE, holder=found, level=logging.DEBUG, label=label)
                return None
            owner = found
            sticky.keep(spec.name, owner)
    run_key = spec.run_key(args, kwargs, task) if spec.run is not None else None
    run_label = spec.run_template(task) if spec.run is not None else ""

    def busy(key: str, holder: Holder | None) -> None:
        skipped(task or spec.name, key, _busy(spec), holder=holder, label=run_label)

    _, result = yield from _run_lock_steps(spec, locks, owner, run_key, busy, run_label)
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
        found = yield Acquire(key, _ttl_ms(locks, spec.once.ttl_ms), label, "owner")
        if not isinstance(found, Lock):
            _command_skipped(spec, command, key, ELSEWHERE, found, "its hold ends", label)
            return None
        owner = found
        log_owner(spec.name, owner)

    run_label = spec.run_template() if spec.run is not None else ""

    def busy(key: str, holder: Holder | None) -> None:
        _command_skipped(spec, command, key, _busy(spec), holder, "its lease expires", run_label)

    try:
        run_key = spec.run_key(args, kwargs, None) if spec.run is not None else None
        ran, result = yield from _run_lock_steps(spec, locks, owner, run_key, busy, run_label)
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


class _Carried(Exception):
    """The job's own ``StopIteration``, carried through the protocol: a generator may not let
    one out (it would become a ``RuntimeError``)."""

    def __init__(self, error: StopIteration) -> None:
        super().__init__(error)
        self.error = error


def _thrown(error: BaseException) -> BaseException:
    return _Carried(error) if isinstance(error, StopIteration) else error


def _drive(locks: Any, steps: Steps, call: Callable[[], Any]) -> Any:
    """Run ``steps`` with blocking I/O: each step done here, its answer (or error) sent back."""
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        except _Carried as carried:
            error = carried.error
            break
        answer, error = None, None
        try:
            if isinstance(step, Call):
                answer = call()
            elif isinstance(step, Acquire):
                answer = locks._acquire(
                    step.key, step.ttl_ms, 0.0, None, step.label, step.use, permits=step.permits
                )
            elif isinstance(step, Release):
                step.lock.__exit__(None, None, None)  # the lock's own block end
            else:
                _hold_and_leave(step.lock, step.ms)
        except BaseException as exc:
            error = _thrown(exc)
    raise error


async def _adrive(locks: Any, steps: Steps, call: Callable[[], Awaitable[Any]]) -> Any:
    """:func:`_drive` for coroutines: each step awaited (a cancellation is thrown in as any
    error is, so the run lock's release still runs to its end)."""
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        except _Carried as carried:
            error = carried.error
            break
        answer, error = None, None
        try:
            if isinstance(step, Call):
                answer = await call()
            elif isinstance(step, Acquire):
                answer = await locks._aacquire(
                    step.key, step.ttl_ms, 0.0, None, step.label, step.use, permits=step.permits
                )
            elif isinstance(step, Release):
                await step.lock.__aexit__(None, None, None)
            else:
                raise TypeError("min_hold is for management commands, which are synchronous")
        except BaseException as exc:
            error = _thrown(exc)
    raise error


def run_function(
    spec: JobSpec, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """One call of a decorated function: its sticky owner lease (not when it runs as a Celery
    task: beat enforces that), then the run lock for the call."""
    task = _task_name(wrapper)
    locks = _locks()
    steps = _function_steps(spec, locks, task, args, kwargs)
    return _drive(locks, steps, lambda: spec.func(*args, **kwargs))


async def arun_function(
    spec: JobSpec, wrapper: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """:func:`run_function` for a coroutine function."""
    task = _task_name(wrapper)
    locks = _locks()
    steps = _function_steps(spec, locks, task, args, kwargs)
    return await _adrive(locks, steps, lambda: spec.func(*args, **kwargs))


# Management commands: short-lived runs, one per cron tick on every host.


def run_command(spec: JobSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One run of a decorated command's ``handle()``: the owner lease per run, kept until
    ``min_hold`` after the run's start, and the run lock for the run."""
    locks = _locks()
    return _drive(
        locks, _command_steps(spec, locks, args, kwargs), lambda: spec.func(*args, **kwargs)
    )


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
    line = f"Skipped {spec.name}: {reason} ({holder_text(holder, ends)})."
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
