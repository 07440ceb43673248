"""One worker process of the fault suite: loops through the public API on a few keys.

Each round takes a random key with ``Locks(store, ttl=...).lock(key, wait=...)`` and, under it,
does a fenced read-modify-write of the key's counter row (a fenced *claim* that stamps the token
on the row, a read, the critical section, a fenced write of read + 1) and the same read-modify-
write unfenced on a second row (the canary). The writes are made whether or not the lock is still
held at the end: they stand for writes already in flight when a fault struck, which fencing must
refuse and the canary accepts (the ``replace`` and ``max_hold`` scenarios run the rounds of
tests/faults/jobs.py instead). With ``permits`` above 1 (the permits scenario) each lock is one
of the key's permits and the rows are the permit's own (``f:<key>#<permit>``): a permit's token
fences the resource of that permit only (SPEC section 6). On the database stores the same
read-modify-write is also done on a third row, in the lock store's own database, inside
``lock.atomic()``: the atomic canary (tests/faults/atomic_canary.py). Every step goes to a
JSON-lines history stamped with ``time.monotonic()``, one clock for every process of this
machine.

Run by the harness as ``python -m tests.faults.worker`` with DJANGO_LOCKS_TEST_FAULTS_WORKER (JSON)
set.
Signals: SIGUSR1 delays the next fenced write past the release (it is applied from a thread after
the block left); SIGUSR2 holds back the reply of the next store call (the request was sent and
served, the answer arrives late); SIGTERM ends the loop.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any, SupportsIndex

from tests.children import env as _child

CONFIG: dict[str, Any] = _child.read_json("FAULTS_WORKER", {})


class History:
    """Appends one JSON object per line, flushed at once (a killed worker loses nothing written)."""

    def __init__(self, path: str, worker: str) -> None:
        self._fh = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._mutex = threading.Lock()
        self._base = {"w": worker, "pid": os.getpid()}

    def __call__(self, event: str, t: float | None = None, **fields: Any) -> None:
        record = {
            "e": event,
            "t": time.monotonic() if t is None else t,
            "wall": time.time(),  # only to show a faked wall clock: nothing reads it
            **self._base,
            **fields,
        }
        line = json.dumps(record)
        with self._mutex:
            self._fh.write(line + "\n")


def _patch_sleep_under_faketime() -> None:
    # libfaketime 0.9.10 (Debian 12) fails clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which
    # time.sleep() uses, with EINVAL when FAKETIME_DONT_FAKE_MONOTONIC=1 keeps the monotonic clock
    # real. Condition waits are not affected: sleep on one of those in that process.
    if "faketime" in os.environ.get("LD_PRELOAD", ""):

        def sleep(seconds: float | SupportsIndex) -> None:
            threading.Event().wait(max(float(seconds), 0.0))

        time.sleep = sleep


def main() -> None:
    import django

    _patch_sleep_under_faketime()

    django.setup()

    from django.db import connections, transaction
    from django.db.models import F

    from django_locks import LockNotAcquiredError, Locks, LocksError, signals
    from django_locks.exceptions import LockLostError
    from django_locks.fencing import fenced_update
    from tests.faults.atomic_canary import AtomicCanary
    from tests.faults.store import build_store
    from tests.testapp.models import StockCount

    config = CONFIG
    rng = random.Random(config["seed"])
    record = History(config["history"], config["name"])
    ttl = float(config["ttl"])
    store = build_store(config["store"], record)
    locks = Locks(store, ttl=ttl)
    stop_at = float(config["stop_at"])
    stopping = threading.Event()
    delay_write = threading.Event()
    keepers: dict[int, Any] = {}  # token -> Lock, for the loss receiver's final deadline

    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGUSR1, lambda *_: delay_write.set())
    signal.signal(signal.SIGUSR2, lambda *_: store.arm(rng.uniform(0.5, 3.0) * ttl))

    def on_lost(sender: Any, key: str, fencing_token: int, detected_by: str, **_: Any) -> None:
        now = time.monotonic()
        lock = keepers.get(fencing_token)
        deadline = lock.deadline if lock is not None else None
        record("lost", now, key=key, token=fencing_token, by=detected_by, deadline=deadline)

    signals.lock_lost.connect(on_lost, weak=False)

    def rows(kind: str, key: str) -> Any:
        return StockCount.objects.filter(product=f"{kind}:{key}")

    def write(kind: str, key: str, token: int, fn: Any, **extra: Any) -> bool:
        start = time.monotonic()
        try:
            accepted = bool(fn())
        except Exception as exc:  # a write that failed is recorded, never counted as accepted
            record(
                "write",
                kind=kind,
                key=key,
                token=token,
                start=start,
                end=time.monotonic(),
                accepted=False,
                error=repr(exc)[:200],
                **extra,
            )
            connections.close_all()
            return False
        record(
            "write",
            kind=kind,
            key=key,
            token=token,
            start=start,
            end=time.monotonic(),
            accepted=accepted,
            **extra,
        )
        return accepted

    def delayed(key: str, token: int, fenced_value: int, canary_value: int, delay: float) -> None:
        """The writes were sent before the release and reach the database ``delay`` later."""

        def run() -> None:
            try:
                with transaction.atomic():
                    connections["default"].cursor().execute("SELECT pg_sleep(%s)", [delay])
                    write(
                        "fenced",
                        key,
                        token,
                        lambda: fenced_update(rows("f", key), token, count=fenced_value),
                        value=fenced_value,
                        delayed=delay,
                    )
                    write(
                        "canary",
                        key,
                        token,
                        lambda: rows("c", key).update(count=canary_value),
                        value=canary_value,
                        delayed=delay,
                    )
            finally:
                connections.close_all()

        threading.Thread(target=run, name="delayed-write").start()

    atomic = None
    if config.get("atomic_canary"):
        atomic = AtomicCanary(record, rows, config["store"]["using"])
    atomic_share = float(config.get("atomic_share") or 1.0)

    def critical_section(lock: Any, base: str) -> None:
        token = lock.fencing_token
        # Events name the key asked for; writes name the row they go to (the permit's own).
        key = base if lock.permit is None else f"{base}#{lock.permit}"
        claimed = write(
            "claim", key, token, lambda: fenced_update(rows("f", key), lock, count=F("count"))
        )
        fenced_read = rows("f", key).values_list("count", flat=True).get()
        canary_read = rows("c", key).values_list("count", flat=True).get()
        # The atomic canary's block spans the section as the canary's read and write do.
        if atomic is not None and lock.permit is None and rng.random() < atomic_share:
            atomic.open(lock, key)
        until = time.monotonic() + rng.uniform(0, config["cs_max"])
        record("cs", key=base, token=token, until=until)
        deadline = lock.deadline
        while (remaining := until - time.monotonic()) > 0:
            if lock.signal.wait(min(remaining, 0.1)):
                break
            if lock.deadline != deadline:
                deadline = lock.deadline
                record("deadline", key=base, token=token, deadline=deadline)
        if delay_write.is_set():
            delay_write.clear()
            delay = rng.uniform(1.5, 3.0) * ttl
            record("delay_write", key=base, token=token, delay=delay)
            if atomic is not None:
                atomic.hand_off(lock, key, delay)
            if claimed:
                delayed(key, token, fenced_read + 1, canary_read + 1, delay)
            return
        if atomic is not None:
            atomic.close(lock, key)
        if claimed:
            write(
                "fenced",
                key,
                token,
                lambda: fenced_update(rows("f", key), lock, count=fenced_read + 1),
                value=fenced_read + 1,
            )
        write(
            "canary",
            key,
            token,
            lambda: rows("c", key).update(count=canary_read + 1),
            value=canary_read + 1,
        )

    class Rollback(Exception):
        pass

    keys = config["keys"]
    permits = int(config.get("permits") or 1)
    jobs = None
    if config.get("scenario") in ("replace", "max_hold"):
        from tests.faults.jobs import Jobs

        jobs = Jobs(locks, record, write, rows, rng, config, keepers)
    while not stopping.is_set() and time.monotonic() < stop_at:
        key = rng.choice(keys)
        wait = rng.uniform(0, 2 * ttl)
        try:
            if jobs is not None:
                jobs.round(key)
                continue
            record("invoke", key=key, wait=wait)
            if config.get("atomic") and rng.random() < 0.5:
                # Taken inside a transaction that is rolled back: the lease must survive it.
                lock = None
                try:
                    with transaction.atomic():
                        lock = locks.acquire(key, wait=wait, permits=permits)
                        StockCount.objects.filter(product=f"c:{key}").update(count=F("count"))
                        raise Rollback
                except Rollback:
                    pass
                if lock is None:
                    raise LockNotAcquiredError(key, wait)
                record("rolled_back", key=key, token=lock.fencing_token, held=lock.held)
                block: Any = lock
            else:
                block = locks.lock(key, wait=wait, permits=permits)
            with block as lock:
                keepers[lock.fencing_token] = lock
                record(
                    "ok",
                    key=key,
                    token=lock.fencing_token,
                    owner=lock.owner,
                    deadline=lock.deadline,
                    permit=lock.permit,
                    permits=permits,
                )
                try:
                    critical_section(lock, key)
                finally:
                    reason = lock.signal.reason
                    lost = isinstance(reason, LockLostError)
                    record(
                        "release",
                        key=key,
                        token=lock.fencing_token,
                        deadline=lock.deadline,
                        held=lock.held,
                        lost=lost,
                    )
            keepers.pop(lock.fencing_token, None)
        except LockNotAcquiredError:
            record("fail", key=key)
        except LocksError as exc:
            record("error", key=key, error=repr(exc)[:300])
            time.sleep(0.1)
        except Exception as exc:  # a resource write failing mid-round (the store restarting)
            record("error", key=key, error=repr(exc)[:300])
            connections.close_all()
            time.sleep(0.1)
    record("exit")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
