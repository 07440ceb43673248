"""The keys jobs and elections claim, so that two different jobs never share a lock by accident.

A decorated job claims its job key and the lease keys it uses (``<key>`` for a run lock,
``<key>:owner`` for an owner lease, ``<key>`` for an election). A second, different job claiming
any of them is refused when it registers, naming both. The same function registered again (its
module imported twice, or under two names) is not a duplicate: functions are told apart by their
source file and line, not by the module name they were imported under.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured


@dataclasses.dataclass(frozen=True)
class Job:
    """A registered job: its dotted name for messages and its identity for comparisons."""

    name: str
    identity: tuple[str, int, str]
    kind: str
    key: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name} (key {self.key!r})"


_mutex = threading.Lock()
_claims: dict[str, Job] = {}


def job_for(func: Callable[..., Any], *, kind: str, key: str) -> Job:
    target = inspect.unwrap(func)
    code = getattr(target, "__code__", None)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
    if code is not None:
        identity = (code.co_filename, code.co_firstlineno, target.__qualname__)
    else:
        identity = (name, 0, name)
    return Job(name=name, identity=identity, kind=kind, key=key)


def claim(job: Job, *names: str) -> None:
    """Claim ``names`` (a job key and the lease keys it uses) for ``job``.

    Raises ``ImproperlyConfigured`` naming both jobs when a different job claimed one already.
    """
    with _mutex:
        for name in names:
            other = _claims.get(name)
            if other is not None and other.identity != job.identity:
                raise ImproperlyConfigured(
                    f"The lock key {name!r} of {job} is already used by {other}. Two different "
                    "jobs sharing a key would skip each other's runs: give one of them another "
                    "key= (keys must also differ from another job's '<key>:owner' lease and from "
                    "election keys)."
                )
        for name in names:
            _claims.setdefault(name, job)


def claimed() -> dict[str, Job]:
    """Every claimed key and its job (for ``run_leader --list`` and diagnostics)."""
    with _mutex:
        return dict(_claims)


def unclaim(job: Job) -> None:
    """Forget ``job``'s claims (tests that define jobs in a function body)."""
    with _mutex:
        for name in [name for name, other in _claims.items() if other.identity == job.identity]:
            del _claims[name]
