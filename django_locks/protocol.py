"""The run protocol's steps and its two drivers: a decorated job's run as a generator of the steps
that need I/O, done with blocking calls or on the event loop.

A protocol (``django_locks.run``) yields each step and is sent its answer (or has its error
thrown in). Sync and async runs share the protocol whole; their drivers differ only in how each
step is done.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from django_locks.aio import attempt
from django_locks.events import Use
from django_locks.exceptions import StoreError
from django_locks.lock import Lock
from django_locks.on_commit import end_block

logger = logging.getLogger("django_locks")


@dataclasses.dataclass(frozen=True)
class Acquire:
    """Try ``key`` for ``ttl_ms`` (checked values), waiting up to ``wait_s`` for it; answered
    with the Lock, else the holder the last try found (or None). ``label`` (the job's key
    template) and ``use`` are the event stream's; ``max_hold_ms``: None for none."""

    key: str
    ttl_ms: int
    label: str
    use: Use
    permits: int = 1
    wait_s: float = 0.0
    max_hold_ms: int | None = None


@dataclasses.dataclass(frozen=True)
class Preempt:
    """Ask the live holder of ``key`` to give it up (``on_conflict="replace"``); answered with
    the fencing token the request names, or None when no live lease held the key."""

    key: str


@dataclasses.dataclass(frozen=True)
class Release:
    """Release ``lock`` as leaving its ``with`` block does: a store failure is logged, never
    raised over the run's result or exception (the lease lapses at its ttl); an async release
    completes whatever the cancellation (see ``Lock.arelease``)."""

    lock: Lock
    commit_alias: str | None = None  # release="on_commit": once that alias's transaction ends
    failed: bool = False  # the run raised (under several aliases, logged instead of raised)


@dataclasses.dataclass(frozen=True)
class LeaveFor:
    """Leave ``lock`` in the store ``ms`` more, then let it lapse (commands: synchronous)."""

    lock: Lock
    ms: int


class Call:
    """Call the job; answered with its result, or its exception thrown in."""


CALL = Call()
Step = Acquire | Preempt | Release | LeaveFor | Call
Steps = Generator[Step, Any, Any]


class _Carried(Exception):
    """The job's own ``StopIteration``, carried through the protocol: a generator may not let
    one out (it would become a ``RuntimeError``)."""

    def __init__(self, error: StopIteration) -> None:
        super().__init__(error)
        self.error = error


def _thrown(error: BaseException) -> BaseException:
    return _Carried(error) if isinstance(error, StopIteration) else error


def drive(locks: Any, steps: Steps, call: Callable[[], Any]) -> Any:
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
                    step.key,
                    step.ttl_ms,
                    step.wait_s,
                    None,
                    step.label,
                    step.use,
                    permits=step.permits,
                    max_hold_ms=step.max_hold_ms,
                )
            elif isinstance(step, Preempt):
                answer = locks._preempt(step.key)
            elif isinstance(step, Release):
                if step.commit_alias is None:
                    step.lock.__exit__(None, None, None)  # the lock's own block end
                else:
                    end_block(step.lock, step.commit_alias, failed=step.failed)
            else:
                _hold_and_leave(step.lock, step.ms)
        except BaseException as exc:
            error = _thrown(exc)
    raise error


async def adrive(locks: Any, steps: Steps, call: Callable[[], Awaitable[Any]]) -> Any:
    """:func:`drive` for coroutines: each step awaited (a cancellation is thrown in as any
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
                    step.key,
                    step.ttl_ms,
                    step.wait_s,
                    None,
                    step.label,
                    step.use,
                    permits=step.permits,
                    max_hold_ms=step.max_hold_ms,
                )
            elif isinstance(step, Preempt):
                # A store call: in a thread, never on the event loop (it writes nothing to give
                # back when the task is cancelled meanwhile).
                answer = await attempt(functools.partial(locks._preempt, step.key), _no_undo)
            elif isinstance(step, Release):
                await step.lock.__aexit__(None, None, None)
            else:
                raise TypeError("min_hold is for management commands, which are synchronous")
        except BaseException as exc:
            error = _thrown(exc)
    raise error


def _no_undo(token: int) -> None:
    """A preempt request is not given back: the holder it names stops, or it goes stale."""


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
