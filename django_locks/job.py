"""What a decorated job is: the arguments of its decorators, its keys, and the keys it claims."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_locks import registry
from django_locks.conflicts import OnConflict
from django_locks.keys import permit_suffix, render_key, validate_key

OWNER_SUFFIX = ":owner"

ATTRIBUTE = "__django_locks__"
"""The attribute of a decorated function holding its :class:`JobSpec`."""


@dataclasses.dataclass(frozen=True)
class OnceSpec:
    """What ``on_one_instance`` was given."""

    key: str | None
    ttl_ms: int | None
    min_hold_ms: int | None
    max_hold_ms: int | None = None
    catch_up: bool = False


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What ``without_overlapping`` (``permits`` 1) or ``limit_concurrency`` was given
    (``max_hold_ms`` None: the service's default; ``wait_ms`` None: the policy's)."""

    key: str | None
    ttl_ms: int | None
    permits: int = 1
    max_hold_ms: int | None = None
    on_conflict: OnConflict = "skip"
    wait_ms: int | None = None
    max_retries: int = 3
    shared_key: bool = False
    on_commit: bool = False  # release="on_commit": the run lock follows `using`'s transaction
    using: str | None = None

    @property
    def decorator(self) -> str:
        return "limit_concurrency" if self.permits > 1 else "without_overlapping"


@dataclasses.dataclass
class JobSpec:
    """A decorated job: the original function and the decorators applied to it.

    ``default_key`` is ``module.function`` (Celery's default task name) or the command's name; a
    Celery task named otherwise uses its task name (``django_locks.contrib.celery`` passes it).
    """

    func: Callable[..., Any]
    name: str
    default_key: str
    is_command: bool
    is_async: bool
    once: OnceSpec | None = None
    run: RunSpec | None = None

    def owner_template(self, default: str | None = None) -> str:
        """The key template of the owner lease (without ``:owner``)."""
        assert self.once is not None
        return self.once.key or (self.run and self.run.key) or default or self.default_key

    def run_template(self, default: str | None = None) -> str:
        assert self.run is not None
        return self.run.key or (self.once and self.once.key) or default or self.default_key

    def owner_key(self, args: tuple[Any, ...], kwargs: dict[str, Any], default: str | None) -> str:
        """The owner lease key of one call (``<key>:owner``)."""
        key = render_key(self.owner_template(default), self.func, args, kwargs)
        return validate_key(key, suffix=OWNER_SUFFIX)

    def run_key(self, args: tuple[Any, ...], kwargs: dict[str, Any], default: str | None) -> str:
        """The run lock key of one call (its permit slots' keys included in the 500 characters)."""
        assert self.run is not None
        key = render_key(self.run_template(default), self.func, args, kwargs)
        validate_key(key, suffix=permit_suffix(self.run.permits))  # (the slot keys' length)
        return key

    def claim(self, default: str | None = None) -> None:
        """Claim this job's keys in the registry (refusing another job's), forgetting old ones.
        A run lock key with ``shared_key`` is claimed shared: other jobs sharing it may too."""
        job = registry.job_for(self.func, kind="job", key=self.default_key)
        registry.unclaim(job)
        names: list[str] = []
        shared: list[str] = []
        if self.once is not None:
            key = self.owner_template(default)
            names += [key, key + OWNER_SUFFIX]
        if self.run is not None:
            key = self.run_template(default)
            if not self.run.shared_key:
                names.append(key)
            elif key in names:
                raise ImproperlyConfigured(
                    f"{self.name}: shared_key=True shares the run lock {key!r} with other jobs, "
                    "but it is also this job's own on_one_instance key. Give @on_one_instance "
                    "a key of its own (on_one_instance(key=...))."
                )
            else:
                shared.append(key)
        job = registry.job_for(self.func, kind="job", key=(names or shared)[0])
        registry.claim(job, *dict.fromkeys(names), shared=shared)


def job_spec(func: object) -> JobSpec | None:
    """The :class:`JobSpec` of a decorated function (looking through ``__wrapped__``), or None."""
    seen = 0
    while func is not None and seen < 100:
        func = getattr(func, "__func__", func)
        spec = getattr(func, ATTRIBUTE, None)
        if isinstance(spec, JobSpec):
            return spec
        func = getattr(func, "__wrapped__", None)
        seen += 1
    return None
