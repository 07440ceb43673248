"""The checks of ``manage.py locks health`` and the django-health-check backend, computed once."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

from django_locks import leader, process
from django_locks.exceptions import StoreError, StoreTimeoutError
from django_locks.holders import Holder
from django_locks.keys import validate_key
from django_locks.service import Locks, locks
from django_locks.stores.base import LockStore
from django_locks.stores.naming import describe_store

logger = logging.getLogger("django_locks")

T = TypeVar("T")

DEFAULT_TIMEOUT = 3.0
"""Seconds all the checks of one probe may take together (``locks health --timeout``)."""

PROBE_KEY = "django_locks:health"
"""The key the store check reads (a read: nothing is ever written under it)."""

BEAT_ELECTION_PREFIX = "celery-beat:"
"""The whole-beat mode's election is ``celery-beat:<Celery app main name>`` (``BeatGuard``)."""

UNKNOWN_BEAT = BEAT_ELECTION_PREFIX + "?"
"""The name of the beat's election check when no Celery app tells its key (that check fails)."""

CheckKind = Literal["store", "election"]


@dataclasses.dataclass(frozen=True)
class Check:
    """One check's outcome: what was checked (``kind`` and ``name``: the store as people name
    it, or an election's key), whether it passed, its ``status`` ("ok (3 ms)", "led by ...",
    "no leader: ..."), the ``fix`` of a failure, and for an election its leader and fencing
    token. ``str()`` is the line ``locks health`` prints."""

    kind: CheckKind
    name: str
    ok: bool
    status: str
    fix: str | None = None
    ms: float | None = None
    source: str | None = None
    leader: Holder | None = None
    fencing_token: int | None = None

    def __str__(self) -> str:
        subject = f"store {self.name}" if self.kind == "store" else f"election {self.name!r}"
        line = f"{subject}: {self.status}"
        return line if self.fix is None else f"{line}; fix: {self.fix}"

    def as_json(self) -> dict[str, Any]:
        """The check as ``locks health --json`` prints it."""
        return {
            "check": self.kind,
            "name": self.name,
            "ok": self.ok,
            "status": self.status,
            "fix": self.fix,
            "ms": None if self.ms is None else round(self.ms, 3),
            "source": self.source,
            "leader": None if self.leader is None else str(self.leader),
            "fencing_token": self.fencing_token,
        }


def elections(extra: Iterable[str] = (), *, registered: bool = True) -> dict[str, str]:
    """The elections a probe expects a leader for, each key with where it comes from.

    With ``registered``: every ``@leader_election`` of this process (an installed app's
    ``leaders`` module, imported as ``run_leader`` finds them, or any module imported at
    startup), and with ``LOCKS["CELERY_BEAT_LEADER"]`` on, the beat's election of each Celery app
    this process created. Then each key of ``extra`` (``--election``), checked before any I/O:
    an invalid key raises ``ValueError`` / ``TypeError`` naming it.
    """
    extra = list(extra)
    for key in extra:
        validate_key(key, name="--election")
    found: dict[str, str] = {}
    if registered:
        for key, election in leader.discover().items():
            found[key] = f"@leader_election {election.name}"
        if _beat_leader_mode() and not any(k.startswith(BEAT_ELECTION_PREFIX) for k in extra):
            apps = _celery_app_names()
            for name in apps:
                found[BEAT_ELECTION_PREFIX + name] = "celery beat (CELERY_BEAT_LEADER)"
            if not apps:
                found[UNKNOWN_BEAT] = "celery beat (CELERY_BEAT_LEADER)"
    for key in extra:
        found.setdefault(key, "--election")
    return found


def run(
    expected: Mapping[str, str] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    service: Locks | None = None,
) -> list[Check]:
    """The store check, then one check per election of ``expected`` (default:
    :func:`elections`), all within ``timeout`` seconds together: a store that does not answer
    in time fails its check and leaves the elections unchecked (failed), never a hang. Reads
    only, through the service (default: ``django_locks.locks``): its ``lease()``, so an
    election is looked up under the service's key prefix, and another project's leases in
    the same store play no part."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not timeout > 0:  # also refuses NaN
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    service = service if service is not None else locks
    expected = elections() if expected is None else expected
    deadline = time.monotonic() + timeout
    store_check = _store_check(service, deadline, timeout)
    checks = [store_check]
    for key, source in expected.items():
        if not store_check.ok:
            checks.append(
                Check(
                    "election",
                    key,
                    False,
                    "not checked: the store check failed",
                    "see the store's line",
                    source=source,
                )
            )
        elif key == UNKNOWN_BEAT:
            checks.append(_unknown_beat(source))
        else:
            checks.append(_election_check(service, key, source, deadline, timeout))
    return checks


def healthy(checks: Iterable[Check]) -> bool:
    """Whether every check passed."""
    return all(check.ok for check in checks)


def _store_check(service: Locks, deadline: float, timeout: float) -> Check:
    store = service.store
    name = describe_store(store)
    started = time.monotonic()
    try:
        call(lambda: service.lease(PROBE_KEY), deadline)
    except NotImplementedError:
        return Check(
            "store",
            name,
            False,
            "cannot be checked: the store cannot describe a lease",
            f"implement lease() (or leases()) in {type(store).__qualname__}, as the "
            "custom store how-to describes, so that a probe can read without writing",
        )
    except Exception as exc:
        return Check("store", name, False, *failure(exc, store, timeout))
    ms = (time.monotonic() - started) * 1000
    return Check("store", name, True, f"ok ({_ms(ms)})", ms=ms)


def _election_check(
    service: Locks, key: str, source: str, deadline: float, timeout: float
) -> Check:
    try:
        lease = call(lambda: service.lease(key), deadline)
    except Exception as exc:
        return Check("election", key, False, *failure(exc, service.store, timeout), source=source)
    if lease is None or lease.state != "held":
        return Check(
            "election",
            key,
            False,
            "no leader: no process holds its lease",
            _campaign_fix(key, source),
            source=source,
        )
    holder = lease.described
    return Check(
        "election",
        key,
        True,
        f"led by {holder.describe()} (fencing token {lease.fencing_token})",
        source=source,
        leader=holder,
        fencing_token=lease.fencing_token,
    )


def _campaign_fix(key: str, source: str) -> str:
    if source.startswith("celery beat"):
        return (
            "start `celery beat` on at least one replica with LOCKS['CELERY_BEAT_LEADER'] on "
            "(a running beat that cannot reach the store, or lost its lease, says so in its log)"
        )
    fix = (
        f"start `manage.py run_leader {key}` (or whatever campaigns for it) on at least one "
        "replica; if one runs, its log says why it does not lead"
    )
    if source == "--election":
        fix += " (no @leader_election declares this key: check its spelling)"
    return fix


def _unknown_beat(source: str) -> Check:
    return Check(
        "election",
        UNKNOWN_BEAT,
        False,
        "cannot tell the beat's election: this process created no Celery app",
        "import your Celery app at startup (the project package's __init__.py, as Celery's "
        "Django guide does), or name its key: --election celery-beat:<app main name>",
        source=source,
    )


def failure(exc: Exception, store: LockStore, timeout: float) -> tuple[str, str]:
    """The status and the fix of a check whose store call failed."""
    if isinstance(exc, TimeoutError | StoreTimeoutError):
        return (
            f"no answer within {timeout:g}s",
            "check that the server is up and not paused or overloaded and that this host "
            "reaches it (firewall, DNS); a slow store needs a longer timeout (--timeout of "
            "`locks health`, timeout= of the health-check backend)",
        )
    if isinstance(exc, StoreError):
        fix = "check that the server is running and reachable from this host, and that "
        fix += "LOCKS['OPTIONS'] points at it"
        if _is_database_store(store):
            fix += "; then that `manage.py migrate` has run on its database"
        return f"error: {str(exc).rstrip('.')}", fix
    logger.error("The health check of %s failed unexpectedly", describe_store(store), exc_info=exc)
    return (
        f"failed: {type(exc).__name__}: {exc}",
        "see the django_locks log for the traceback; the store's own checks: "
        "`manage.py check --deploy`",
    )


def _is_database_store(store: LockStore) -> bool:
    from django_locks.stores.database import DatabaseStore

    return isinstance(store, DatabaseStore)


def _ms(ms: float) -> str:
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def _beat_leader_mode() -> bool:
    from django_locks import conf

    return conf.get().celery_beat_leader


def _celery_app_names() -> list[str]:
    """The main name of each Celery app this process created (not Celery's fallback app), as
    ``BeatGuard`` names the beat's election (``app.main or "celery"``)."""
    if importlib.util.find_spec("celery") is None:
        return []
    from django_locks.contrib import celery_compat  # Celery's private API, in one place

    apps = celery_compat.active_apps()
    fallback = celery_compat.fallback_app()
    names = {
        app.main or "celery"
        for app in apps
        if not (app is fallback and app.main == "default" and not app.set_as_current)
    }
    return sorted(names)


class _Worker:
    """The one thread of this process that makes the probes' store calls.

    One thread, kept: the database store keeps a connection per calling thread, so a thread per
    probe would leave one behind each time. A call stuck past its probe's deadline keeps the
    thread busy until the store's own timeout ends it; the probes meanwhile fail on time (their
    calls are cancelled before they start). A daemon thread: a stuck call never holds up the
    exit of ``locks health``."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._queue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._mutex:
            thread = self._thread
            if thread is None or self._pid != process.pid() or not thread.is_alive():
                # A forked child has no thread of its parent's: start its own.
                self._queue = queue.SimpleQueue()
                self._thread = thread = threading.Thread(
                    target=self._serve, args=(self._queue,), name="django_locks-health", daemon=True
                )
                self._pid = process.pid()
                thread.start()
            self._queue.put((fn, future))
        return future

    @staticmethod
    def _serve(
        calls: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]],
    ) -> None:
        while True:
            fn, future = calls.get()
            if not future.set_running_or_notify_cancel():
                continue  # its probe gave up on it already
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the waiting probe
                future.set_exception(exc)


_worker = _Worker()


def call(fn: Callable[[], T], deadline: float, stop: threading.Event | None = None) -> T:
    """``fn()`` on the probes' thread; ``TimeoutError`` when it has not answered by ``deadline``
    (``time.monotonic()``), or when ``stop`` is set; ``fn``'s own exception else."""
    future = _worker.submit(fn)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or (stop is not None and stop.is_set()):
            future.cancel()
            raise TimeoutError("no answer in time")
        # wait(), not result(timeout=): fn's own TimeoutError must not read as "not yet".
        done, _ = concurrent.futures.wait([future], timeout=min(left, 0.05) if stop else left)
        if done:
            return future.result()
