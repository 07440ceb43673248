"""The fault worker's rounds in the ``replace`` and ``max_hold`` scenarios (tests/faults/worker.py
runs them; tests/faults/job_checks.py reads what they record).

``replace``: a round tries its key once; finding it taken, half the rounds do what
``on_conflict="replace"`` does, a preempt request (``Locks._preempt``) and then a wait for the
key up to ttl + ttl/3, the others just wait (0 to 2 ttl). Holders work in steps (a fenced
read-modify-write of the key's row and the same unfenced on the canary) while they check their
signal, stop at once when it aborts and leave their block.

``max_hold``: every round takes its key with ``max_hold`` and a long wait, then its job either
*hangs* (a stuck job: it sleeps past its lease's lapse, ignoring the signal, then makes the
write it had in flight), *works* until its signal aborts and nothing else (a job that never
returns on its own), or *finishes* well before ``max_hold``.

Besides the worker's events: ``preempt`` (key, token asked or None, start, end), ``aborted``
(the instant a lock's signal aborted with a ``LockLostError``: its class, ``detected_by`` and
token; a thread per lock waits for it), ``left`` (the block was left, ``released``: whether the
store confirmed the release, None when it failed),
``job`` (the ``max_hold`` job drawn) and ``fail`` with a ``code``.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db.models import F

from django_locks import Lock, Locks
from django_locks.exceptions import LockLostError, StoreError
from django_locks.fencing import fenced_update
from django_locks.policy import POLICY

REPLACE_SHARE = 0.5
"""The share of rounds that replace the holder they find (the others wait their turn)."""
STEP = 0.15
"""Seconds between a holder's write steps, each one after a look at its signal."""
JOBS = {"hang": 2, "work": 2, "finish": 1}
"""The ``max_hold`` jobs, and how often each is drawn."""


@dataclass
class Jobs:
    """One worker's rounds; ``write(kind, key, token, fn, **extra)`` and ``rows(kind, key)`` are
    the worker's (tests/faults/worker.py)."""

    locks: Locks
    record: Callable[..., None]
    write: Callable[..., bool]
    rows: Callable[[str, str], Any]
    rng: random.Random
    config: dict[str, Any]
    keepers: dict[int, Lock]

    @property
    def ttl(self) -> float:
        return float(self.config["ttl"])

    def round(self, key: str) -> None:
        if self.config["scenario"] == "replace":
            self.replace(key)
        else:
            self.capped(key)

    # replace

    def replace(self, key: str) -> None:
        replacing = self.rng.random() < REPLACE_SHARE
        self.record("invoke", key=key, wait=0.0, replace=replacing)
        lock = self.locks.acquire(key)
        asked: int | None = None
        asked_at: float | None = None
        if lock is None:
            if replacing:
                asked_at = time.monotonic()
                asked = self.locks._preempt(key)
                self.record("preempt", key=key, token=asked, start=asked_at, end=time.monotonic())
                wait = self.ttl + self.ttl / 3  # what on_conflict="replace" waits by default
            else:
                wait = self.rng.uniform(0, 2 * self.ttl)
            self.record("invoke", key=key, wait=wait, replace=replacing)
            lock = self.locks.acquire(key, wait=wait)
            if lock is None:
                self.record("fail", key=key, code="not_replaced" if replacing else "taken")
                return
        until = time.monotonic() + self.rng.uniform(0, self.config["cs_max"])
        work = partial(self.steps, lock, key, until)
        self.hold(lock, key, work, replacing=replacing, asked=asked, asked_at=asked_at)

    # max_hold

    def capped(self, key: str) -> None:
        max_hold = float(self.config["max_hold"])
        wait = max_hold + 2 * self.ttl + self.rng.uniform(0, self.ttl)
        self.record("invoke", key=key, wait=wait)
        lock = self.locks.acquire(key, wait=wait, max_hold=max_hold)
        if lock is None:
            self.record("fail", key=key, code="taken")
            return
        job = self.rng.choices(list(JOBS), weights=list(JOBS.values()))[0]
        if job == "finish":
            work = partial(
                self.steps, lock, key, time.monotonic() + self.rng.uniform(0, max_hold / 2)
            )
        elif job == "work":
            work = partial(self.steps, lock, key, math.inf)
        else:
            work = partial(self.hang, lock, key, max_hold)
        self.hold(lock, key, work, max_hold=max_hold, job=job)

    def hang(self, lock: Lock, key: str, max_hold: float) -> None:
        """A stuck job: its claim and read, then asleep past its lease's lapse (the signal
        unheard), then the write it had in flight, which the next holder's claim must refuse."""
        token = lock.fencing_token
        claimed = self.claim(lock, key)
        value = self.rows("f", key).values_list("count", flat=True).get()
        until = time.monotonic() + max_hold + self.ttl + self.rng.uniform(0.5, 1.5) * self.ttl
        self.record("cs", key=key, token=token, until=until)
        time.sleep(max(0.0, until - time.monotonic()))
        if claimed:
            self.write(
                "fenced",
                key,
                token,
                lambda: fenced_update(self.rows("f", key), token, count=value + 1),
                value=value + 1,
            )

    # A holder's life.

    def hold(self, lock: Lock, key: str, work: Callable[[], None], **extra: Any) -> None:
        """The block of ``lock``: its acquire recorded, its signal watched (a thread records the
        instant it aborts), ``work``, its release recorded, and then that it was left."""
        token = lock.fencing_token
        with lock:
            self.keepers[token] = lock
            self.record(
                "ok",
                key=key,
                token=token,
                owner=lock.owner,
                deadline=lock.deadline,
                # When the acquire was sent: the instant its first deadline counts from.
                sent=lock.deadline - POLICY.deadline(0.0, lock.ttl),
                ttl=lock.ttl,
                permit=None,
                permits=1,
                **extra,
            )
            self.watch(lock, key)
            try:
                work()
            finally:
                self.record("release", key=key, token=token, deadline=lock.deadline, held=lock.held)
            # What leaving the block does, for its answer: whether the store confirmed the
            # lease was still ours and freed it (a lock lost or capped is not freed, it lapses).
            released: bool | None = None
            with contextlib.suppress(StoreError):
                released = lock.release()
        self.keepers.pop(token, None)
        self.record("left", key=key, token=token, released=released)

    def watch(self, lock: Lock, key: str) -> None:
        token = lock.fencing_token

        def watch() -> None:
            lock.signal.wait()
            reason = lock.signal.reason
            if isinstance(reason, LockLostError):
                self.record(
                    "aborted",
                    key=key,
                    token=token,
                    reason=type(reason).__name__,
                    by=reason.detected_by,
                    reason_token=reason.fencing_token,
                )

        threading.Thread(target=watch, name=f"watch-{token}", daemon=True).start()

    def claim(self, lock: Lock, key: str) -> bool:
        return self.write(
            "claim",
            key,
            lock.fencing_token,
            lambda: fenced_update(self.rows("f", key), lock, count=F("count")),
        )

    def steps(self, lock: Lock, key: str, until: float) -> None:
        """Write in steps until ``until`` or until the signal aborts (checked before each step;
        a step under way is a write in flight, finished). A round that is not stuck never
        outlives its lease's lapse after a cap by much: a signal that never aborts shows."""
        token = lock.fencing_token
        claimed = self.claim(lock, key)
        until = min(
            until, time.monotonic() + float(self.config.get("max_hold") or 0) + 3 * self.ttl
        )
        self.record("cs", key=key, token=token, until=until)
        deadline = lock.deadline
        while (remaining := until - time.monotonic()) > 0:
            if lock.signal.wait(min(remaining, STEP)):
                break
            if lock.deadline != deadline:
                deadline = lock.deadline
                self.record("deadline", key=key, token=token, deadline=deadline)
            if claimed:
                value = self.rows("f", key).values_list("count", flat=True).get()
                self.write(
                    "fenced",
                    key,
                    token,
                    lambda value=value: fenced_update(self.rows("f", key), lock, count=value + 1),
                    value=value + 1,
                )
            canary = self.rows("c", key).values_list("count", flat=True).get()
            self.write(
                "canary",
                key,
                token,
                lambda canary=canary: self.rows("c", key).update(count=canary + 1),
                value=canary + 1,
            )
