"""Uniqueness at enqueue time (SPEC section 14): one lease per rendered key, from the enqueue of a
message to its run's start (``until="started"``) or end (``until="finished"``).

Shared by the two front ends, Celery's (``django_locks.contrib.celery_unique``) and django.tasks'
(``django_locks.contrib.tasks_unique``); each says how its messages are identified:

* **enqueue** (:func:`claim`): one store round trip, ``acquire`` for an owner id *derived* from the
  message's id (:func:`owner_for`: an HMAC of ``SECRET_KEY``), so that nothing secret travels in
  the message; refused with ``AlreadyQueuedError`` while another message holds the key. The lease
  is not renewed: a message that never runs frees its key after ``ttl``. A publish that fails
  gives it back (:func:`unclaim`).
* **run** (:func:`take_over`): the worker derives the same owner id and takes the lease over with
  an idempotent acquire, then holds it (renewed, on the service's ttl) until the run ends, or
  gives it back at once under ``until="started"``. A run whose enqueue-time lease lapsed takes the
  key if it is free and runs; if another enqueue holds it, the run is skipped as a duplicate (a
  WARNING naming both messages, ``run_skipped(code="duplicate")``): that later message will run.

The default key is ``<task name>:<sha256 of the canonical JSON of the arguments>``: the call's
arguments bound to the function's signature with its defaults applied (so ``f(1, b=2)``,
``f(b=2, a=1)`` and ``f(1)`` with ``b=2`` the default are one key), as JSON with sorted keys and
no whitespace. Arguments JSON cannot encode are a ``TypeError`` at the enqueue.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from django_locks import durations
from django_locks.attempts import told_acquired, try_once
from django_locks.events import label_of
from django_locks.exceptions import AlreadyQueuedError
from django_locks.holders import Holder, this_process
from django_locks.keys import call_arguments, check_template, render_key, validate_key
from django_locks.lock import Lock
from django_locks.ownership import DUPLICATE, skipped
from django_locks.policy import POLICY

if TYPE_CHECKING:
    from django_locks.service import Locks

logger = logging.getLogger("django_locks")

Until = Literal["started", "finished"]
"""How long an enqueue-time lease lasts: until its run starts, or until it ends."""

UNTILS: tuple[Until, ...] = ("started", "finished")


@dataclasses.dataclass(frozen=True)
class UniqueSpec:
    """What ``unique(...)`` / ``unique_task(...)`` was given, checked: the task's ``name``, its
    ``func`` (whose signature binds the arguments), the key ``template`` (None: the default
    key), ``until`` and the enqueue-time lease's ``ttl_ms``."""

    name: str
    func: Callable[..., Any]
    template: str | None
    until: Until
    ttl_ms: int

    def key(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The rendered key of one call (``ValueError`` / ``TypeError`` naming the rule)."""
        if self.template is None:
            digest = hashlib.sha256(arguments_json(self.func, args, kwargs).encode())
            key = f"{self.name}:{digest.hexdigest()}"
        else:
            key = render_key(self.template, self.func, args, kwargs)
        return validate_key(key, name="the rendered unique key")


def unique_spec(
    func: Callable[..., Any], name: str, *, key: object, until: object, ttl: object
) -> UniqueSpec:
    """Check the options of ``unique`` / ``unique_task`` at decoration time: ``key`` None or a
    template naming the function's arguments, ``until`` ``"started"`` or ``"finished"``,
    ``ttl`` a duration of 50 ms to 366 days (required: how long a message that never runs keeps
    its key)."""
    if key is not None:
        if not isinstance(key, str):
            raise TypeError(f"`key` must be a str (a key or a template) or None, got {key!r}")
        validate_key(key, name="key")
        check_template(key, func)
    if not isinstance(until, str) or until not in UNTILS:
        error = ValueError if isinstance(until, str) else TypeError
        raise error(f"`until` must be 'started' or 'finished', got {until!r}")
    if ttl is None:
        raise TypeError(
            "`ttl` is required: how long a queued message keeps its key if it never runs "
            "(for example ttl='1h'; a duration of 50ms to 366d)"
        )
    ttl_ms = durations.ttl_ms(ttl)  # type: ignore[arg-type]
    return UniqueSpec(name=name, func=func, template=key, until=until, ttl_ms=ttl_ms)


def arguments_json(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    template_helps: bool = True,
) -> str:
    """The canonical JSON of one call's arguments: bound to ``func``'s signature, defaults
    applied, ``**kwargs`` merged in, sorted keys, no whitespace. ``TypeError`` for arguments
    the signature does not take, or that JSON cannot encode (naming the argument; its hint
    suggests a key template unless ``template_helps`` is False: a caller that demands JSON
    arguments whatever the key)."""
    try:
        values = call_arguments(func, args, kwargs)
    except TypeError as exc:
        raise TypeError(
            f"the arguments do not fit {getattr(func, '__qualname__', func)}(): {exc}"
        ) from None
    try:
        return json.dumps(
            values, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError):
        pass  # which argument: each is tried on its own below (only on this failure)
    hint = ", or give the task a key template (key=...)" if template_helps else ""
    for name, value in values.items():
        try:
            json.dumps(value, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"argument {name!r} cannot be part of a unique key: JSON cannot encode "
                f"{type(value).__name__} {value!r:.100} ({exc}). Pass JSON values (str, int, "
                f"float, bool, None, lists, dicts with str keys){hint}."
            ) from None
    raise TypeError(f"the arguments of {getattr(func, '__qualname__', func)}() are not JSON")


def owner_for(message_id: str) -> str:
    """The owner id of the enqueue-time lease of the message ``message_id`` (a Celery task id,
    a django.tasks nonce): an HMAC of ``SECRET_KEY``, so the id in the message, which is not
    secret, does not give the owner id away."""
    from django.conf import settings

    secret = str(settings.SECRET_KEY).encode()
    return hmac.new(
        secret, b"django_locks.unique:" + message_id.encode(), hashlib.sha256
    ).hexdigest()


def _locks() -> Locks:
    from django_locks.service import locks

    return locks


def claim(spec: UniqueSpec, key: str, message_id: str) -> int:
    """At enqueue, before the message is published: take ``key`` for the message
    ``message_id`` for ``spec.ttl_ms``, in one store round trip; return the fencing token.
    Raises ``AlreadyQueuedError`` when another message holds it, ``StoreError`` when the store
    fails (nothing is enqueued either way)."""
    locks = _locks()
    holder = dataclasses.replace(this_process(), detail=message_id)
    found = locks.store.acquire_as(
        locks.key_prefix + key,
        owner_for(message_id),
        spec.ttl_ms,
        holder,
        timeout=POLICY.acquire_timeout(spec.ttl_ms),
    )
    if isinstance(found, int):
        return found
    raise AlreadyQueuedError(spec.name, key, found)


def unclaim(key: str, message_id: str) -> None:
    """The publish after :func:`claim` failed: give the key back (a failure here is logged: the
    lease lapses at its ttl)."""
    locks = _locks()
    try:
        locks.store.release(locks.key_prefix + key, owner_for(message_id))
    except Exception:
        logger.warning(
            "Could not give back the unique key %r of a message that was not enqueued; it is "
            "free again after its ttl",
            key,
            exc_info=True,
        )


def take_over(spec: UniqueSpec, key: str, message_id: str, run_id: str) -> Lock | bool:
    """At the start of the run of the message ``message_id`` (``run_id``: how people know that
    run, a Celery task id or a django.tasks result id): under ``until="finished"`` the ``Lock``
    it runs under (the enqueue-time lease taken over, or the key taken afresh when that lapsed
    and the key is free), renewed on the service's ttl; under ``until="started"``, ``True``
    once the key is given back. ``False`` when the run is a duplicate (its lease lapsed and a
    later enqueue holds the key): it is logged (WARNING) and ``run_skipped`` is sent; do not
    run it."""
    locks = _locks()
    owner = owner_for(message_id)
    if spec.until == "started" and locks.store.release(locks.key_prefix + key, owner):
        return True
    began = locks.clock.monotonic()
    found = try_once(locks, key, locks.ttl_ms, label_of(spec.template or key), "run", owner=owner)
    if isinstance(found, Lock):
        lock = told_acquired(locks, found, began)
        if spec.until == "started":
            lock.release()
            return True
        return lock
    _duplicate(spec, key, run_id, found)
    return False


def _duplicate(spec: UniqueSpec, key: str, run_id: str, holder: Holder | None) -> None:
    other = (
        f"message {holder.detail}" if holder is not None and holder.detail else "another message"
    )
    skipped(
        f"{spec.name} (message {run_id}; its enqueue-time lease lapsed before it ran, and "
        f"{other}, queued or running, holds the key: that one runs instead)",
        key,
        DUPLICATE,
        holder=holder,
        level=logging.WARNING,
        label=label_of(spec.template or key),
    )
