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

``without_overlapping`` holds the run lock ``<key>`` for the whole run, wherever it runs; what a
run that finds it taken does is its ``on_conflict`` (``django_locks.conflicts``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Literal, ParamSpec, TypeVar, cast, overload

from django_locks import durations
from django_locks.conflicts import OnConflict
from django_locks.decorating import (
    JobDecorator,
    KeepingJobDecorator,
    check_key_argument,
    run_spec,
    wrap_job,
)
from django_locks.durations import Duration
from django_locks.job import OWNER_SUFFIX, JobSpec, OnceSpec, job_spec
from django_locks.keys import check_permits, permit_suffix
from django_locks.on_commit import Release
from django_locks.ownership import ELSEWHERE, IN_PROGRESS, release_owner_leases, skipped
from django_locks.run import holder_text, set_task_name_hook

# The names users and the other modules import from here; each lives in its concept's module.
__all__ = [
    "ELSEWHERE",
    "IN_PROGRESS",
    "OWNER_SUFFIX",
    "JobDecorator",
    "JobSpec",
    "KeepingJobDecorator",
    "holder_text",
    "job_spec",
    "limit_concurrency",
    "on_one_instance",
    "release_owner_leases",
    "set_task_name_hook",
    "skipped",
    "without_overlapping",
]

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")

Skipping = Literal["skip", "replace"]
"""The ``on_conflict`` values under which a run may be skipped: the result may be ``None``."""
Keeping = Literal["raise", "retry"]
"""The ``on_conflict`` values under which a run that does not run raises: the result is kept."""


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
    max_hold: Duration | None = None,
    catch_up: bool = False,
) -> JobDecorator: ...


def on_one_instance(
    key: str | Callable[..., Any] | None = None,
    *,
    ttl: Duration | None = None,
    min_hold: Duration | None = None,
    max_hold: Duration | None = None,
    catch_up: bool = False,
) -> Any:
    """Run the decorated job on one instance: the owner of the lease ``<key>:owner``.

    ``key``: the job's key, or a template formatted from the call's arguments
    (``"report:{customer_id}"``); default: the task's name, ``module.function`` or the command's
    name. ``ttl``: the owner lease's ttl (default ``LOCKS["TTL"]``): after the owner dies, another
    instance takes over within it. ``min_hold``: management commands only, how long after a run's
    start the lease stays taken (default ``LOCKS["MIN_HOLD"]``), so the same cron tick elsewhere
    skips. ``max_hold``: the longest one owner lease is held (``None``, the default: no limit;
    ``LOCKS["MAX_HOLD"]`` never applies to owner leases). ``catch_up``: Celery beat entries only,
    each published tick is recorded first, and a beat taking over publishes the latest tick its
    predecessor missed, once (without it, missed ticks are reported only). A skipped call logs,
    sends ``run_skipped`` and returns ``None``. Usable bare (``@on_one_instance``) or called.
    """
    if callable(key):
        return on_one_instance()(key)
    check_key_argument(key, suffix=OWNER_SUFFIX)
    if not isinstance(catch_up, bool):
        raise TypeError(f"`catch_up` must be True or False, got {catch_up!r}")
    spec = OnceSpec(
        key=key,
        ttl_ms=None if ttl is None else durations.ttl_ms(ttl),
        min_hold_ms=None if min_hold is None else durations.min_hold_ms(min_hold),
        max_hold_ms=durations.max_hold_ms(max_hold),
        catch_up=catch_up,
    )

    def decorate(target: F) -> F:
        return cast(F, wrap_job(target, once=spec))

    return decorate


@overload
def without_overlapping(
    key: Callable[P, Coroutine[Any, Any, R]], /
) -> Callable[P, Coroutine[Any, Any, R | None]]: ...


@overload
def without_overlapping(key: Callable[P, R], /) -> Callable[P, R | None]: ...


@overload
def without_overlapping(
    key: str | None = None,
    *,
    ttl: Duration | None = None,
    max_hold: Duration | None = None,
    on_conflict: Skipping = "skip",
    wait: Duration | None = None,
    max_retries: int = 3,
    shared_key: bool = False,
    release: Release = "on_exit",
    using: str | None = None,
) -> JobDecorator: ...


@overload
def without_overlapping(
    key: str | None = None,
    *,
    ttl: Duration | None = None,
    max_hold: Duration | None = None,
    on_conflict: Keeping,
    wait: Duration | None = None,
    max_retries: int = 3,
    shared_key: bool = False,
    release: Release = "on_exit",
    using: str | None = None,
) -> KeepingJobDecorator: ...


@overload
def without_overlapping(
    key: str | None = None,
    *,
    ttl: Duration | None = None,
    max_hold: Duration | None = None,
    on_conflict: OnConflict,
    wait: Duration | None = None,
    max_retries: int = 3,
    shared_key: bool = False,
    release: Release = "on_exit",
    using: str | None = None,
) -> JobDecorator: ...


def without_overlapping(
    key: str | Callable[..., Any] | None = None,
    *,
    ttl: Duration | None = None,
    max_hold: Duration | None = None,
    on_conflict: OnConflict = "skip",
    wait: Duration | None = None,
    max_retries: int = 3,
    shared_key: bool = False,
    release: Release = "on_exit",
    using: str | None = None,
) -> Any:
    """Never run the decorated job while a run of it holds the run lock ``<key>``, anywhere.

    ``key`` as for :func:`on_one_instance`; ``ttl``: the run lock's ttl (default
    ``LOCKS["TTL"]``), renewed for the whole run; ``max_hold``: renewals stop this long after
    the run took the lock (its signal aborts; default ``LOCKS["MAX_HOLD"]``). Inside the run,
    ``current_lock()`` is the run lock, whose fencing token grows with every run.

    ``on_conflict``: what a run that finds the lock held does (``django_locks.conflicts``):
    ``"skip"`` (logged, ``run_skipped`` sent, ``None`` returned), ``"raise"``
    (``LockNotAcquiredError``), ``"retry"`` (a Celery task retries itself later, at most
    ``max_retries`` times, then fails with ``LockNotAcquiredError``; not for management
    commands) or ``"replace"`` (the running one is asked to stop and the run waits for the key,
    else is skipped). ``wait``: how long to wait for the lock before that (default 0; under
    ``"replace"``, how long to wait for the running one to stop: ttl + ttl/3 by default).
    ``shared_key=True``: other jobs use this key too, one run at a time among all of them
    (each must set it). ``release="on_commit"`` and ``using``: a run that ends inside
    ``transaction.atomic()`` keeps the run lock until that transaction commits, as for
    :meth:`Locks.lock` (a ``TypeError`` on a coroutine function). Usable bare or called.
    """
    if callable(key):
        return without_overlapping()(key)
    check_key_argument(key)
    spec = run_spec(
        key, ttl, max_hold, on_conflict, wait, max_retries, release, using, shared_key=shared_key
    )

    def decorate(target: F) -> F:
        return cast(F, wrap_job(target, run=spec))

    return decorate


@overload
def limit_concurrency(
    key: str | None = None,
    *,
    permits: int,
    ttl: Duration | None = None,
    max_hold: Duration | None = None,
    on_conflict: Skipping = "skip",
    wait: Duration | None = None,
    max_retries: int = 3,
    release: Release = "on_exit",
    using: str | None = None,
) -> JobDecorator: ...


@overload
def limit_concurrency(
    key: str | None = None,
    *,
    permits: int,
    ttl: Duration | None = None,
    max_hold: Duration | None = None,
    on_conflict: Keeping,
    wait: Duration | None = None,
    max_retries: int = 3,
    release: Release = "on_exit",
    using: str | None = None,
) -> KeepingJobDecorator: ...


@overload
def limit_concurrency(
    key: str | None = None,
    *,
    permits: int,
    ttl: Duration | None = None,
    max_hold: Duration | None = None,
    on_conflict: OnConflict,
    wait: Duration | None = None,
    max_retries: int = 3,
    release: Release = "on_exit",
    using: str | None = None,
) -> JobDecorator: ...


def limit_concurrency(
    key: str | None = None,
    *,
    permits: int,
    ttl: Duration | None = None,
    max_hold: Duration | None = None,
    on_conflict: OnConflict = "skip",
    wait: Duration | None = None,
    max_retries: int = 3,
    release: Release = "on_exit",
    using: str | None = None,
) -> Any:
    """Run at most ``permits`` runs of the decorated job at once, anywhere: each run holds one
    of the key's permits (``<key>#<n>``) for the whole run, renewed and fenced like a lock.

    ``key`` as for :func:`on_one_instance` (a template: ``"export:{tenant}"`` limits each
    tenant on its own); ``permits``: 1 to 1000 (1 is :func:`without_overlapping`); ``ttl``:
    each permit's ttl (default ``LOCKS["TTL"]``); ``max_hold``, ``on_conflict``, ``wait`` and
    ``max_retries`` as for :func:`without_overlapping` (``"replace"`` asks the oldest holder to
    stop). Inside a run, ``current_lock()`` is its permit (``.permit`` says which). By default
    a run that finds every permit taken is skipped: logged, ``run_skipped`` sent with
    ``code="at_capacity"``, ``None`` returned. Every user of the key gives the same
    ``permits``. Needs a store offering permits (the database, Redis and in-memory stores).
    ``release`` and ``using`` as for :func:`without_overlapping`.
    """
    count = check_permits(permits)
    check_key_argument(key, suffix=permit_suffix(count))
    spec = run_spec(
        key, ttl, max_hold, on_conflict, wait, max_retries, release, using, permits=count
    )

    def decorate(target: F) -> F:
        return cast(F, wrap_job(target, run=spec))

    return decorate
