"""Every piece of per-process state in the package, and what becomes of it in a fork()ed child."""

# The one at-fork hook of the package lives here, with the one ``os.getpid()``: fork safety is
# reviewed by reading AFTER_FORK below, not seven modules (``tests/test_process.py`` fails on a
# ``register_at_fork`` or ``os.getpid`` anywhere else). A module never imported has no state, so
# the hook skips it; this module imports none of the package, so that every module can import it
# (``clock.py`` and ``stores/base.py`` do, and everything with state imports one of them: the hook
# is registered before there is anything to forget). ``docs/internals/process.rst`` lists the
# same steps for people.

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

logger = logging.getLogger("django_locks")

T = TypeVar("T")


class Step(NamedTuple):
    """What happens to one piece of per-process state in a forked child."""

    module: str
    function: str
    """A function of ``module`` taking no argument, called in the child (the only thread there)."""
    state: str
    """The state, and what becomes of it: for people reviewing fork safety."""


AFTER_FORK: tuple[Step, ...] = (
    Step(
        "django_locks.aio",
        "forget_pools_in_child",
        "The thread pools of async calls and of async release-notice watches, and the waiting "
        "rooms of async release notices: dropped (their threads stayed in the parent, so their "
        "waiters would never be woken); fresh pools on first use.",
    ),
    Step(
        "django_locks.clock",
        "forget_background_in_child",
        "The system clock's timer thread and notice thread: dropped, not shut down (their threads "
        "are gone); started afresh on first use.",
    ),
    Step(
        "django_locks.renewal_batch",
        "forget_batches_in_child",
        "The renewal batches of each store and clock (their mutexes, their running flags): "
        "forgotten; the child's own locks make new ones.",
    ),
    Step(
        "django_locks.renewal",
        "detach_inherited_locks",
        "The locks the parent holds: detached without I/O (not held here, their signals abort, "
        "their callbacks are not run; their mutexes made afresh). After the clock step: their "
        "timers are the parent's, never cancelled here.",
    ),
    Step(
        "django_locks.ownership",
        "forget_owner_leases_in_child",
        "The sticky owner leases of decorated functions: forgotten (the renewal step detached "
        "them; the child takes its own on its first call), their mutex made afresh.",
    ),
    Step(
        "django_locks.owners",
        "renew_owners_after_fork",
        "The prefix of owner ids: drawn afresh, so that the child never reuses the parent's ids "
        "(it could re-acquire the parent's leases idempotently).",
    ),
    Step(
        "django_locks.contrib.opentelemetry",
        "forget_counts_in_child",
        "The OpenTelemetry exporter's counts (held locks, owner leases, leaderships, the counters "
        "and the waits not recorded yet): forgotten, its mutex made afresh; the child counts "
        "what it does.",
    ),
    Step(
        "django_locks.contrib.prometheus",
        "forget_counts_in_child",
        "The Prometheus exporter's numbers in one process's mode (held locks, owner leases, "
        "leaderships, counters, histograms): forgotten, its mutex made afresh. In multiprocess "
        "mode prometheus-client keeps each process's values in files of its pid: nothing to do.",
    ),
    Step(
        "django_locks.process",
        "forget_process_locals",
        "Every ProcessLocal (the stores' connections and pools, the Redis Cluster's slot map, the "
        "database store's LISTEN session, the Redis store's wait-outage flag lock, the watchdog): "
        "made afresh on first use; the parent's value is handed to its inherited() or kept "
        "referenced forever, never used nor closed (closing would end the parent's sessions).",
    ),
)
"""In the order the steps run in a forked child."""


def after_fork_in_child() -> None:
    """Run every step of :data:`AFTER_FORK` whose module is imported; a failing step is logged
    and the others still run."""
    for step in AFTER_FORK:
        module = sys.modules.get(step.module)
        if module is None:  # never imported: it has no state
            continue
        try:
            getattr(module, step.function)()
        except Exception:
            logger.exception("django_locks: %s.%s() failed in a forked child", *step[:2])


os.register_at_fork(after_in_child=after_fork_in_child)


def pid() -> int:
    """This process's id, asked each time (right in a child whatever forked it)."""
    return os.getpid()


_HOLDER: tuple[int, str] = (0, "")


def holder() -> str:
    """``host:pid`` of this process, as leases and beat's leader record who holds them, for
    people reading (looked up once per process: ``gethostname()`` is a system call)."""
    global _HOLDER
    current = os.getpid()
    if _HOLDER[0] != current:
        _HOLDER = (current, f"{socket.gethostname()}:{current}")
    return _HOLDER[1]


class ProcessLocal(Generic[T]):
    """A value of this process, made by ``factory()`` on first use and made afresh in a forked
    child; the parent's value is handed to ``inherited(value)`` there (default: kept referenced
    forever, so that nothing closes what the parent still uses) and never used again."""

    def __init__(
        self, factory: Callable[[], T], inherited: Callable[[T], None] | None = None
    ) -> None:
        self._factory = factory
        self._inherited = inherited
        self._value: T | None = None
        self._pid = 0
        self._lock = threading.Lock()
        _PROCESS_LOCALS.add(self)

    def get(self) -> T:
        value = self._value
        if value is not None and self._pid == os.getpid():
            return value
        with self._lock:
            if self._value is not None and self._pid != os.getpid():
                # A child the at-fork hook did not reach (os.fork() skips no hook, but a
                # C extension's fork might): the parent's value is still never used or closed.
                keep_forever(self._value)
                self._value = None
            if self._value is None:
                self._value = self._factory()
                self._pid = os.getpid()
            return self._value

    def peek(self) -> T | None:
        """The value, if this process made one (no factory call)."""
        return self._value if self._pid == os.getpid() else None

    def take(self) -> T | None:
        """The value, if this process made one, forgotten here: the next :meth:`get` makes a new
        one (a store's ``close()``)."""
        with self._lock:
            if self._pid != os.getpid():
                return None
            value, self._value = self._value, None
            return value

    def _forget_in_child(self) -> None:
        value, self._value = self._value, None
        self._lock = threading.Lock()  # another thread may have held it at fork() time
        if value is None:
            return
        if self._inherited is None:
            keep_forever(value)
        else:
            try:
                self._inherited(value)
            except Exception:
                logger.exception("django_locks: forgetting %r in a forked child failed", value)


_PROCESS_LOCALS: weakref.WeakSet[ProcessLocal[Any]] = weakref.WeakSet()
_INHERITED: list[object] = []
"""What a forked child inherited and keeps referenced forever: never closed, never used."""


def keep_forever(inherited: object) -> None:
    """In a forked child: keep what the parent owned referenced forever, so that the garbage
    collector never closes it (closing would end the parent's sessions)."""
    _INHERITED.append(inherited)


def forget_process_locals() -> None:
    for local in list(_PROCESS_LOCALS):
        local._forget_in_child()
