"""What a run does when it finds its run lock taken: ``on_conflict`` and ``wait`` (SPEC section 12).

* ``"skip"`` (the default): logged with the rendered key and the holder, ``run_skipped`` sent
  (``code="in_progress"``, or ``"at_capacity"`` under permits), ``None`` returned;
* ``"raise"``: ``LockNotAcquiredError`` (a Celery task fails with it);
* ``"retry"``: a Celery task retries itself later with backoff (``Task.retry``), a django.tasks
  task is enqueued again with ``run_after`` (``django_locks.contrib.tasks``), at most
  ``max_retries`` times, then fails with ``LockNotAcquiredError``. Refused at decoration for
  management commands; a call that turns out not to run as a task raises
  ``ImproperlyConfigured`` at its first conflict;
* ``"replace"``: a preempt request for the holder's token, then a wait for the key (default
  ttl + ttl/3), else ``"skip"`` with ``code="not_replaced"``. Refused for a store without
  preempt requests.

``wait`` is how long a run waits for the lock before its policy applies (under ``"replace"``: how
long it waits for the preempted holder to let go).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from django.core.exceptions import ImproperlyConfigured

from django_locks import durations
from django_locks.exceptions import LockNotAcquiredError
from django_locks.holders import Holder
from django_locks.lock import Lock
from django_locks.ownership import AT_CAPACITY, IN_PROGRESS, NOT_REPLACED
from django_locks.policy import POLICY
from django_locks.protocol import Acquire, Preempt, Step

if TYPE_CHECKING:
    from django_locks.job import RunSpec
    from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")

OnConflict = Literal["skip", "raise", "retry", "replace"]
"""What a run that finds its run lock taken does."""

POLICIES: tuple[OnConflict, ...] = ("skip", "raise", "retry", "replace")

MAX_RETRIES = 1000
"""The most ``max_retries`` accepted."""


# Checked when a job is decorated.


def check_on_conflict(value: object) -> OnConflict:
    """``value`` if it is one of :data:`POLICIES`; ``TypeError`` / ``ValueError`` naming them."""
    if isinstance(value, str) and value in POLICIES:
        return value
    rule = "`on_conflict` must be one of 'skip', 'raise', 'retry' or 'replace'"
    error = ValueError if isinstance(value, str) else TypeError
    raise error(f"{rule}, got {value!r}")


def check_max_retries(value: object) -> int:
    """``value`` if it is an int from 0 to :data:`MAX_RETRIES` (``bool`` refused)."""
    rule = f"`max_retries` must be an int from 0 to {MAX_RETRIES}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{rule}, got {value!r}")
    if not 0 <= value <= MAX_RETRIES:
        raise ValueError(f"{rule}, got {value!r}")
    return value


def check_wait(value: object) -> int | None:
    """``None`` (the policy's default), else ``value`` in milliseconds, 0 to 366 days."""
    return None if value is None else durations.wait_ms(value)  # type: ignore[arg-type]


def refuse_retry_for_commands(spec_name: str, is_command: bool, policy: OnConflict) -> None:
    """A management command is not a task: nothing would run it again later."""
    if is_command and policy == "retry":
        raise ValueError(
            f"`on_conflict` 'retry' is for task runs, but {spec_name} is a management command: "
            "nothing would run it again later. Use on_conflict='skip' (the next cron tick runs "
            "it), 'raise' (the command fails) or 'replace', or give it a wait=."
        )


def refuse_replace_backend() -> None:
    """``"replace"`` needs a store offering preempt requests: read from the configured
    ``BACKEND``'s class (the store is not built). Settings not configured yet, or not valid
    (that is told at startup): checked at the first run instead."""
    from django.conf import settings

    if not settings.configured:
        return
    from django_locks import conf

    try:
        config = conf.get()
    except ImproperlyConfigured:
        return
    if not getattr(config.backend, "supports_preempt", False):
        raise _no_preempt(config.backend_path)


def check_replace_store(store: LockStore) -> None:
    """At each ``"replace"`` run: the store in use offers preempt requests."""
    if not getattr(type(store), "supports_preempt", False):
        cls = type(store)
        raise _no_preempt(f"{cls.__module__}.{cls.__qualname__}")


def _no_preempt(backend: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"on_conflict='replace' needs a store offering preempt requests, and LOCKS['BACKEND'] "
        f"{backend!r} does not (supports_preempt is False). Use a store that does "
        "('django_locks.stores.DatabaseStore', 'django_locks.stores.RedisStore'), or another "
        "on_conflict ('skip', 'raise' or 'retry')."
    )


# At a run.


def first_wait_s(run: RunSpec) -> float:
    """How long the first acquire waits: ``wait`` (0 by default); under ``"replace"``, 0 (its
    wait comes after the preempt request)."""
    if run.on_conflict == "replace" or run.wait_ms is None:
        return 0.0
    return run.wait_ms / 1000


def replace_wait_s(run: RunSpec, ttl_ms: int) -> float:
    """How long a replacing run waits for the preempted holder: ``wait``, default ttl + ttl/3
    (the holder reads the request within ttl/3 and its lease lapses at most a ttl later)."""
    if run.wait_ms is not None:
        return run.wait_ms / 1000
    return POLICY.replace_wait(ttl_ms / 1000)


def busy_reason(run: RunSpec) -> str:
    """Why a run that found its run lock taken is skipped (the ``reason`` of ``run_skipped``)."""
    return AT_CAPACITY if run.permits > 1 else IN_PROGRESS


def retry_delay(retries: int, ttl_ms: int) -> float:
    """Seconds before retry number ``retries + 1``: ttl/3 doubled at each retry, at most 10
    minutes, drawn from the upper half (the policy's ``task_retry_delay``)."""
    return POLICY.task_retry_delay(retries, ttl_ms / 1000)


Skip = Callable[[str, "Holder | None", str], None]
"""Tell of a skipped run: ``skip(key, holder, reason)``."""


def resolve(
    run: RunSpec,
    tried: Acquire,
    holder: Holder | None,
    *,
    name: str,
    task: str | None,
    skip: Skip,
    task_run: Any = None,
) -> Generator[Step, Any, Lock | None]:
    """The policy of a run whose ``tried`` acquire found ``holder`` (None: the store cannot
    say): the run lock it got after all (``"replace"``), else None once ``skip`` was told (or a
    django.tasks run was enqueued again); or raised. ``name``: the job's, ``task``: the Celery
    task's this call runs as (None: not a task), ``task_run``: the django.tasks run it makes
    (``django_locks.contrib.tasks.TaskRun``; None: not one)."""
    policy = run.on_conflict
    if policy == "skip":
        skip(tried.key, holder, busy_reason(run))
        return None
    if policy == "replace":
        token = yield Preempt(tried.key)
        wait_s = replace_wait_s(run, tried.ttl_ms)
        logger.info(
            "Replacing %s (key %r): %s; waiting up to %gs for the key",
            name,
            tried.key,
            "the key was free already"
            if token is None
            else f"asked the run holding fencing token {token} to stop",
            wait_s,
        )
        found = yield dataclasses.replace(tried, wait_s=wait_s)
        if isinstance(found, Lock):
            return found
        skip(tried.key, found, NOT_REPLACED)
        return None
    error = LockNotAcquiredError(tried.key, tried.wait_s, holder, run.permits)
    if policy == "raise":
        raise error
    if task_run is not None:
        ttl_ms = tried.ttl_ms
        task_run.retry(lambda retries: retry_delay(retries, ttl_ms), run.max_retries, error)
        return None
    retry(name, task, error, tried.ttl_ms, run.max_retries)


def retry(
    name: str, task: str | None, error: LockNotAcquiredError, ttl_ms: int, max_retries: int
) -> NoReturn:
    """Retry the running Celery task later (``Task.retry``: a new run of it), at most
    ``max_retries`` times; after that the task fails with ``error``."""
    if task is None:
        raise ImproperlyConfigured(
            f"{name} is decorated with on_conflict='retry', but this call of it does not run as "
            "a Celery task or a django.tasks task, so nothing can run it again later (its run lock "
            f"is taken: {error}). Call it as a task (.delay() or .apply_async(), or enqueue() "
            "under @task()), or give it on_conflict='skip' or 'raise' if it is also called "
            "directly."
        )
    from django_locks.contrib import celery as contrib

    contrib.retry_current_task(lambda retries: retry_delay(retries, ttl_ms), max_retries, error)
