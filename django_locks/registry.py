"""The keys jobs and elections claim, so that two different jobs never share a lock by accident.

A decorated job claims its job key and the lease keys it uses (``<key>`` for a run lock,
``<key>:owner`` for an owner lease, ``<key>`` for an election). A second, different job claiming
any of them is refused when it registers, naming both. The same function registered again (its
module imported twice, or under two names) is not a duplicate: functions are told apart by their
source file and line, not by the module name they were imported under.

A run lock key claimed *shared* (``without_overlapping(key, shared_key=True)``) may be claimed
shared by other jobs too: one run at a time among all of them. A job claiming it without
``shared_key``, or claiming shared a key another job claimed for itself, is refused.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Iterable
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
_sharers: dict[str, list[Job]] = {}
"""The jobs that claimed each shared key, in claim order (``_claims`` names one of them)."""


def job_for(func: Callable[..., Any], *, kind: str, key: str) -> Job:
    target = inspect.unwrap(func)
    code = getattr(target, "__code__", None)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
    if code is not None:
        identity = (code.co_filename, code.co_firstlineno, target.__qualname__)
    else:
        identity = (name, 0, name)
    return Job(name=name, identity=identity, kind=kind, key=key)


def claim(job: Job, *names: str, shared: Iterable[str] = ()) -> None:
    """Claim ``names`` (a job key and the lease keys it uses) for ``job``, and ``shared`` (run
    lock keys of ``shared_key=True``) for it among the other jobs sharing them.

    Raises ``ImproperlyConfigured`` naming both jobs when a different job claimed one already
    (for a shared key: without sharing it, or this job does not).
    """
    shared = tuple(shared)
    with _mutex:
        for name in (*names, *shared):
            other = _claims.get(name)
            if other is None or other.identity == job.identity:
                continue
            if name in shared and _shares(name, other):
                continue  # shared by every job that claimed it so far
            raise ImproperlyConfigured(_refusal(job, other, name, name in shared))
        for name in names:
            _claims.setdefault(name, job)
        for name in shared:
            if name not in _claims:
                _sharers[name] = []  # (what an earlier claimer left is stale)
            sharers = _sharers.setdefault(name, [])
            if not _shares(name, job):
                sharers.append(job)
            _claims.setdefault(name, job)


def _shares(name: str, job: Job) -> bool:
    return any(other.identity == job.identity for other in _sharers.get(name, ()))


def _refusal(job: Job, other: Job, name: str, sharing: bool) -> str:
    if sharing or _shares(name, other):
        # One side shares the key on purpose, the other does not.
        return (
            f"The lock key {name!r} of {job} is already used by {other}. Jobs share a run "
            "lock key on purpose only when every one of them sets shared_key=True "
            "(without_overlapping(key, shared_key=True)); set it on both, or give one of them "
            "another key=."
        )
    return (
        f"The lock key {name!r} of {job} is already used by {other}. Two different jobs "
        "sharing a key would skip each other's runs: give one of them another key= (keys must "
        "also differ from another job's '<key>:owner' lease and from election keys), or set "
        "shared_key=True on both without_overlapping() if they share it on purpose."
    )


def claimed() -> dict[str, Job]:
    """Every claimed key and its job (for ``run_leader --list`` and diagnostics)."""
    with _mutex:
        return dict(_claims)


def unclaim(job: Job) -> None:
    """Forget ``job``'s claims (tests that define jobs in a function body); a shared key
    stays claimed by the other jobs sharing it."""
    with _mutex:
        for name in [name for name, other in _claims.items() if other.identity == job.identity]:
            del _claims[name]
        for name, sharers in list(_sharers.items()):
            sharers[:] = [other for other in sharers if other.identity != job.identity]
            if not sharers:
                del _sharers[name]
            elif name not in _claims:
                _claims[name] = sharers[0]
