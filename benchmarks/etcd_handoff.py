"""The etcd handoff (``python -m benchmarks --etcd``, issue 28): what woke each next holder.

``WAITERS`` waiters contend for one key through ``Locks.acquire(key, wait=...)``: processes of
their own (``processes=True``, started by ``spawn``: each its own ``EtcdStore``, so its own watch
stream, as in a fleet of workers), or threads of this process sharing one store and its one
watch. A holder keeps the key ``hold`` seconds, notes the time (``time.monotonic()``, one clock
for every process on Linux) and releases it; after a release it contends again only once another
waiter took the key, so every handoff goes to a waiter that was waiting.

A waiting acquire pauses between tries in ``django_locks.notices.wait_for_release``: calls of
``store.wait_for_release(key, slice)`` of at most 0.25 s each until its backoff step runs out.
``EtcdStore.wait_for_release`` answers ``True`` only when its watch delivered a deletion of the
key's lease record while it waited (``Watch.wait_deleted``: a counter per key moved by DELETE
events alone), ``False`` when its time ran out (or, while the watch fails, after sleeping it
out). Each handoff is classed by the taker's last answer before its successful try, recorded by
:class:`~benchmarks.permits_handoff.NoticeRecorder` (an instance attribute over the store's
method; per thread): ``notice`` (woken by the watch event), ``backoff`` (the pause ran out),
``no pause`` (the first try took it). Each waiter also counts its store's answers, all of them.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.measure import Latency, table, us
from benchmarks.permits_handoff import NoticeRecorder

WAITERS = 8
WAIT_S = 30.0
HEADERS = ["watch event", "backoff step", "no pause", "error", "by a watch event", "median", "p99"]


def say(text: str = "") -> None:
    print(text, flush=True)


class Box:
    """A value shared by threads (what ``multiprocessing.Value`` is for processes)."""

    def __init__(self, value: Any) -> None:
        self.value = value


@dataclasses.dataclass
class Shared:
    """What the waiters share: guarded by ``cond``; ``out`` carries the samples and each
    waiter's last word to the parent."""

    cond: Any
    released_at: Any  # .value: monotonic seconds of the last release not handed off, or nan
    acquisitions: Any
    handoffs: Any
    stop: Any
    ready: Any  # a barrier of WAITERS + 1: every waiter warmed up, and the parent
    out: Any


def shared_for(processes: bool) -> Shared:
    if processes:
        ctx = multiprocessing.get_context("spawn")
        return Shared(
            ctx.Condition(),
            ctx.Value("d", math.nan, lock=False),
            ctx.Value("q", 0, lock=False),
            ctx.Value("q", 0, lock=False),
            ctx.Value("b", False, lock=False),
            ctx.Barrier(WAITERS + 1),
            ctx.Queue(),
        )
    return Shared(
        threading.Condition(),
        Box(math.nan),
        Box(0),
        Box(0),
        Box(False),
        threading.Barrier(WAITERS + 1),
        queue.Queue(),
    )


class CountingRecorder(NoticeRecorder):
    """:class:`NoticeRecorder` that also counts every answer of the store's wait, and notes
    when the last one came (``time.monotonic()``)."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.answers: collections.Counter[str] = collections.Counter()
        self._count = threading.Lock()

    def _recorded(self, key: str, timeout: float) -> bool:
        try:
            return super()._recorded(key, timeout)
        finally:
            self._local.at = time.monotonic()
            with self._count:
                self.answers[self.outcome()] += 1

    def answered_at(self) -> float:
        return float(getattr(self._local, "at", math.nan))


def warm(locks: Any, store: Any) -> None:
    """One acquire + release of a key of this waiter's own (the shared lease granted, the
    watch started), then until the watch stream is created (its notices complete from then)."""
    lock = locks.acquire(f"bench:handoff:warm:{os.getpid()}:{threading.get_ident()}")
    assert lock is not None
    lock.release()
    watch = store._process.get().watch
    give_up = time.monotonic() + 10
    while watch.start < 0:
        if time.monotonic() > give_up:
            raise RuntimeError("the etcd watch did not start within 10 s")
        time.sleep(0.01)


def work(
    locks: Any, recorder: CountingRecorder, key: str, hold: float, target: int, s: Shared
) -> None:
    """One waiter's loop, until ``target`` handoffs were recorded."""

    def taken_since(mine: int) -> Callable[[], bool]:
        return lambda: bool(s.stop.value or s.acquisitions.value > mine)

    while True:
        recorder.begin()
        lock = locks.acquire(key, wait=WAIT_S)
        acquired = time.monotonic()
        if lock is None:
            raise RuntimeError(f"{key!r} stayed taken for {WAIT_S}s")
        with s.cond:
            if not math.isnan(s.released_at.value) and not s.stop.value:
                released = s.released_at.value
                outcome = recorder.outcome()
                woken = recorder.answered_at() - released if outcome == "notice" else math.nan
                s.out.put(("sample", acquired - released, outcome, woken))
                s.released_at.value = math.nan
                s.handoffs.value += 1
                if s.handoffs.value >= target:
                    s.stop.value = True
            s.acquisitions.value += 1
            mine = s.acquisitions.value
            stop = bool(s.stop.value)
            s.cond.notify_all()
        if not stop:
            time.sleep(hold)  # the others settle into waiting
        with s.cond:
            s.released_at.value = releasing = time.monotonic()
        lock.release()
        s.out.put(("release", time.monotonic() - releasing))
        with s.cond:
            s.cond.wait_for(taken_since(mine), timeout=WAIT_S)
            if s.stop.value:
                return


def _stopped(s: Shared) -> None:
    with s.cond:
        s.stop.value = True
        s.cond.notify_all()


def waiter_process(
    endpoints: Sequence[str], prefix: str, key: str, hold: float, target: int, s: Shared
) -> None:
    """A waiter in a process of its own (the ``spawn`` target): its own store and watch."""
    from benchmarks import environment
    from django_locks import Locks
    from django_locks.stores.etcd import EtcdStore

    try:
        environment.configure_django(None)
        store = EtcdStore(endpoints=list(endpoints), prefix=prefix)
        locks = Locks(store)
        recorder = CountingRecorder(store)
        warm(locks, store)
        s.ready.wait(timeout=60)
        work(locks, recorder, key, hold, target, s)
        s.out.put(("done", os.getpid(), dict(recorder.answers)))
    except BaseException as exc:
        s.out.put(("error", os.getpid(), repr(exc)))
        _stopped(s)


def waiter_thread(
    locks: Any, recorder: CountingRecorder, key: str, hold: float, target: int, s: Shared
) -> None:
    try:
        warm(locks, locks.store)
        s.ready.wait(timeout=60)
        work(locks, recorder, key, hold, target, s)
        s.out.put(("done", threading.get_ident(), {}))
    except BaseException as exc:
        s.out.put(("error", threading.get_ident(), repr(exc)))
        _stopped(s)


@dataclasses.dataclass
class Found:
    latency: Latency  # from the holder's release() call to the next holder's acquisition
    woken: collections.Counter[str]  # the handoffs by what ended the taker's last pause
    answers: collections.Counter[str]  # every answer of the waiters' wait_for_release
    seconds: float
    notified: Latency  # from the release() call to the taker's watch waking it (by notice)
    release_calls: Latency  # the holders' release() calls


def run_handoff(
    endpoints: Sequence[str], prefix: str, *, processes: bool, handoffs: int, hold: float
) -> Found:
    from django_locks import Locks
    from django_locks.stores.etcd import EtcdStore

    s = shared_for(processes)
    key = f"bench:handoff:{'processes' if processes else 'threads'}"
    workers: list[Any] = []
    store = recorder = None
    if processes:
        ctx = multiprocessing.get_context("spawn")
        for _ in range(WAITERS):
            started = (list(endpoints), prefix, key, hold, handoffs, s)
            workers.append(ctx.Process(target=waiter_process, args=started, daemon=True))
    else:
        store = EtcdStore(endpoints=list(endpoints), prefix=prefix)
        locks = Locks(store)
        recorder = CountingRecorder(store)
        for _ in range(WAITERS):
            args = (locks, recorder, key, hold, handoffs, s)
            workers.append(threading.Thread(target=waiter_thread, args=args, daemon=True))
    for worker in workers:
        worker.start()
    samples: list[float] = []
    notified: list[float] = []
    releases: list[float] = []
    woken: collections.Counter[str] = collections.Counter()
    answers: collections.Counter[str] = collections.Counter()
    errors: list[str] = []
    try:
        s.ready.wait(timeout=120)
        began = time.monotonic()
        finished = 0
        while finished < WAITERS:
            message = s.out.get(timeout=WAIT_S * 4)
            if message[0] == "sample":
                samples.append(message[1])
                woken[message[2]] += 1
                if not math.isnan(message[3]):
                    notified.append(message[3])
            elif message[0] == "release":
                releases.append(message[1])
            else:
                finished += 1
                if message[0] == "error":
                    errors.append(message[2])
                else:
                    answers.update(message[2])
        seconds = time.monotonic() - began
    finally:
        _stopped(s)
        for worker in workers:
            worker.join(timeout=30)
        if recorder is not None:
            answers.update(recorder.answers)
            recorder.close()
    if errors:
        raise RuntimeError(f"a waiter failed: {errors[0]}")
    return Found(
        Latency(samples or [math.nan]),
        woken,
        answers,
        seconds,
        Latency(notified or [math.nan]),
        Latency(releases or [math.nan]),
    )


def section_handoff(
    endpoints: Sequence[str], prefix: str, *, processes: bool, handoffs: int, hold: float
) -> dict[str, Any]:
    found = run_handoff(endpoints, prefix, processes=processes, handoffs=handoffs, hold=hold)
    latency, woken, answers, seconds = found.latency, found.woken, found.answers, found.seconds
    total = sum(woken.values())
    share = woken["notice"] / total if total else 0.0
    who = "processes, each its own store and watch" if processes else "threads of one process"
    say(
        f"Handoff: {WAITERS} waiting {who}; each holder keeping the key {hold * 1e3:g} ms "
        f"({total} handoffs in {seconds:.1f}s); what woke each next holder, and the time from "
        "the holder's release() call to the next acquisition:"
    )
    say(
        table(
            HEADERS,
            [
                [
                    str(woken["notice"]),
                    str(woken["backoff"]),
                    str(woken["no pause"]),
                    str(woken["error"]),
                    f"{share:.1%}",
                    us(latency.median),
                    us(latency.p99),
                ]
            ],
        )
    )
    say(
        f"  (medians from the release() call: it returned after {us(found.release_calls.median)},"
        f"\n   the taker's watch woke it after {us(found.notified.median)} (p99 "
        f"{us(found.notified.p99)}), it held the key after {us(latency.median)};\n"
        f"   every wait_for_release of the waiters: {answers['notice']} answered True on a "
        f"deletion event, {answers['backoff']} ran out, {answers['error']} raised)"
    )
    say()
    return {
        "handoffs": total,
        "woken": {name: woken[name] for name in ("notice", "backoff", "no pause", "error")},
        "notice_share": round(share, 4),
        "latency": latency.as_dict(),
        "waits": {name: answers[name] for name in ("notice", "backoff", "error")},
        "release_call": found.release_calls.as_dict(),
        "woken_after": found.notified.as_dict(),
        "hold_s": hold,
        "seconds": round(seconds, 1),
    }
