"""What every store shares: per-process state, one call-deadline mechanism, error translation.

A custom store can use all three (``docs/howto/custom-store.rst``):

* :class:`ProcessLocal` holds a value per process (connections, pools): made on first use, and
  made afresh in a forked child, which never uses or closes the parent's (SPEC section 4).
* :func:`deadline` bounds one call: the process's watchdog thread abandons a call still running
  at its deadline (the call's ``abandon()`` shuts its socket down, cancels its statement), so the
  deadline is never enforced by the thread doing the I/O (SPEC section 4).
* :func:`translate` turns a driver's errors into ``StoreError`` (chained to the driver's error)
  and an abandoned call into ``StoreTimeoutError``: errors are translated once per store and
  never fail open.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from django_locks.clock import ERROR_PAUSE, MAX_WAIT
from django_locks.exceptions import StoreError, StoreTimeoutError

# Re-exported: custom stores import them from here (docs/howto/custom-store.rst); their home is
# the module listing every piece of per-process state.
from django_locks.process import ProcessLocal as ProcessLocal
from django_locks.process import keep_forever as keep_forever

logger = logging.getLogger("django_locks")


class Call(Protocol):
    """A store call the watchdog can abandon: what it runs on (a connection) says how."""

    deadline: float
    fired: bool
    """Set by the watchdog just before :meth:`abandon`: the call was abandoned."""

    def abandon(self) -> None:
        """Make the call running on another thread end now (shut its socket down, cancel its
        statement); called once, from the watchdog thread, at the deadline."""


class Watchdog:
    """One thread per process that abandons the calls still running at their deadline."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.watched: set[Call] = set()
        self.wake_at = math.inf
        self.thread: threading.Thread | None = None

    def watch(self, call: Call, deadline: float) -> None:
        with self.cond:
            call.deadline = deadline
            call.fired = False
            self.watched.add(call)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="django_locks-watchdog", daemon=True
                )
                self.thread.start()
            if deadline < self.wake_at:  # otherwise the watchdog wakes up early enough
                self.wake_at = deadline
                self.cond.notify()

    def unwatch(self, call: Call) -> bool:
        """Stop watching ``call``; ``True`` when it was abandoned."""
        with self.cond:
            self.watched.discard(call)
            return call.fired

    def _run(self) -> None:
        # Nothing ends this loop: without it no store call of the process is ever abandoned.
        while True:
            try:
                self._watch()
            except BaseException:
                logger.exception("django_locks watchdog: unexpected error (it goes on)")
                time.sleep(ERROR_PAUSE)

    def _watch(self) -> None:
        while True:
            with self.cond:
                now = time.monotonic()
                wake = math.inf
                due = []
                for call in list(self.watched):
                    if call.deadline <= now:
                        # Marked under the lock: the caller's unwatch() then knows its call
                        # was abandoned, and never reuses its connection.
                        self.watched.discard(call)
                        call.fired = True
                        due.append(call)
                    else:
                        wake = min(wake, call.deadline)
                if not due:
                    self.wake_at = wake
                    # Capped: a deadline days away is waited for an hour at a time, never past
                    # threading.TIMEOUT_MAX.
                    self.cond.wait(min(wake - now, MAX_WAIT))
                    continue
                self.wake_at = -math.inf  # awake: it looks again once these are abandoned
            # Outside the lock: abandoning a call may take a while (a cancel request, a grace
            # before the shutdown), and neither the other due calls nor watch()/unwatch() of
            # every store call in the process may wait for it.
            for call in due:
                try:
                    call.abandon()
                except Exception:
                    logger.exception("django_locks watchdog: abandoning a call failed")


_WATCHDOG: ProcessLocal[Watchdog] = ProcessLocal(Watchdog)


def watchdog() -> Watchdog:
    """The watchdog of this process (started with the first call it watches)."""
    return _WATCHDOG.get()


@contextlib.contextmanager
def deadline(call: Call, at: float) -> Iterator[None]:
    """Bound the block (one store call running on ``call``) by ``at`` (``time.monotonic()``):
    the watchdog abandons it there. Read ``call.fired`` after an error to tell a timeout."""
    dog = watchdog()
    dog.watch(call, at)
    try:
        yield
    finally:
        dog.unwatch(call)


@contextlib.contextmanager
def translate(
    what: str,
    errors: tuple[type[BaseException], ...],
    *,
    call: Call | None = None,
    timeout: float | None = None,
    hint: Callable[[BaseException], str] = lambda exc: "",
) -> Iterator[None]:
    """Turn ``errors`` raised in the block into ``StoreError`` chained to them, naming ``what``
    (the store as people read it, ``"the database 'default'"``) and ending with ``hint(exc)``
    (the fix, where there is one); into ``StoreTimeoutError`` when ``call`` was abandoned at its
    deadline. Never into "not acquired" (STYLE: never fail open)."""
    try:
        yield
    except errors as exc:
        timed_out = call is not None and call.fired
        raise translated(exc, what, timed_out=timed_out, timeout=timeout, hint=hint(exc)) from exc


def translated(
    exc: BaseException,
    what: str,
    *,
    timed_out: bool,
    timeout: float | None = None,
    hint: str = "",
) -> StoreError:
    """The error :func:`translate` raises for ``exc`` (raise it ``from exc``): for a store that
    translates on its error path only, keeping context managers off its hot path."""
    if timed_out:
        after = "" if timeout is None else f" within {timeout:g}s"
        return StoreTimeoutError(
            f"{what[:1].upper()}{what[1:]} did not answer{after}; the call was abandoned "
            "and its connection discarded."
        )
    error = str(exc).rstrip()
    if hint and error and error[-1] not in ".!?":
        error += "."  # the driver's message is a sentence of its own before the hint
    return StoreError(f"{what[:1].upper()}{what[1:]} failed a lock store call: {error}{hint}")
