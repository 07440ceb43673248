"""Timing harnesses: latency side by side, throughput on distinct keys, handoff between waiters.

Every harness takes *contenders* (:class:`Contender`): a name and a way to open a per-thread
session that can take and free a lock. Latencies are measured in round-robin blocks, so that
every contender sees the same machine, and reported as median and p99.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol


class Session(Protocol):
    """One thread's way to use a lock implementation."""

    def pair(self, key: str) -> None:
        """Take ``key`` without waiting and free it again (it must be free)."""

    def acquire(self, key: str) -> Any:
        """Take ``key``, waiting as long as it takes; return what :meth:`release` needs."""

    def release(self, handle: Any) -> None:
        """Free what :meth:`acquire` returned."""

    def close(self) -> None:
        """Give back connections."""


@dataclasses.dataclass
class Contender:
    """A lock implementation under test: ``open()`` makes one session per thread."""

    name: str
    open: Callable[[], Session]
    note: str = ""
    measure_handoff: Callable[..., Handoff] | None = None
    """Measures this contender's handoff itself (the async one: coroutines, not threads)."""


@dataclasses.dataclass
class Latency:
    """Seconds per operation: all samples, median and p99."""

    samples: list[float]
    cpu: float = math.nan
    """Seconds of this process's CPU time (every thread's) per operation."""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p99(self) -> float:
        ordered = sorted(self.samples)
        return ordered[max(math.ceil(0.99 * len(ordered)) - 1, 0)]

    def as_dict(self) -> dict[str, float]:
        return {
            "median_us": round(self.median * 1e6, 1),
            "p99_us": round(self.p99 * 1e6, 1),
            "samples": len(self.samples),
            **({} if math.isnan(self.cpu) else {"cpu_us": round(self.cpu * 1e6, 1)}),
        }


def latencies(
    operations: Mapping[str, Callable[[], object]], *, rounds: int, block: int, warmup: int
) -> dict[str, Latency]:
    """Time each operation ``rounds x block`` times, one block of each in turn (round robin),
    after ``warmup`` untimed calls of each."""
    for operation in operations.values():
        for _ in range(warmup):
            operation()
    samples: dict[str, list[float]] = {name: [] for name in operations}
    cpu = dict.fromkeys(operations, 0.0)
    clock = time.perf_counter
    for _ in range(rounds):
        for name, operation in operations.items():
            record = samples[name].append
            used = time.process_time()
            for _ in range(block):
                start = clock()
                operation()
                record(clock() - start)
            cpu[name] += time.process_time() - used
    return {name: Latency(values, cpu[name] / len(values)) for name, values in samples.items()}


@dataclasses.dataclass(frozen=True)
class Rate:
    """Pairs per second, and this process's CPU time (every thread's) per pair."""

    per_second: float
    cpu: float

    def as_dict(self) -> dict[str, float]:
        return {"per_second": round(self.per_second), "cpu_us": round(self.cpu * 1e6, 1)}


def throughput(contender: Contender, threads: int, seconds: float, prefix: str) -> Rate:
    """Acquire+release pairs per second with ``threads`` threads, each on a key of its own,
    and the process CPU time they took per pair."""
    sessions = [contender.open() for _ in range(threads)]
    for index, session in enumerate(sessions):
        session.pair(f"{prefix}:{index}")  # connect and warm up before the clock starts
    start = threading.Barrier(threads + 1)
    stop = threading.Event()
    counts = [0] * threads

    def work(index: int, session: Session) -> None:
        key = f"{prefix}:{index}"
        start.wait()
        done = 0
        while not stop.is_set():
            session.pair(key)
            done += 1
        counts[index] = done

    workers = [
        threading.Thread(target=work, args=(index, session), daemon=True)
        for index, session in enumerate(sessions)
    ]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    used = time.process_time()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    used = time.process_time() - used
    for session in sessions:
        session.close()
    pairs = sum(counts)
    return Rate(pairs / elapsed, used / pairs if pairs else math.nan)


@dataclasses.dataclass
class Handoff:
    """Seconds from a holder's ``release()`` call to the next holder's acquisition."""

    latency: Latency
    handoffs: int
    seconds: float

    def joined(self, other: Handoff) -> Handoff:
        """This measurement and ``other`` (another turn of the same contender) as one."""
        return Handoff(
            Latency(self.latency.samples + other.latency.samples),
            self.handoffs + other.handoffs,
            self.seconds + other.seconds,
        )


def handoff(contender: Contender, key: str, *, waiters: int, handoffs: int, hold: float) -> Handoff:
    """``waiters`` threads contend for ``key``. Each holder keeps it ``hold`` seconds, notes the
    time and releases it; after a release, the releasing thread only contends again once
    another thread took the lock, so every handoff goes to a thread that was waiting."""
    mutex = threading.Condition()
    samples: list[float] = []
    state: dict[str, Any] = {"released_at": None, "acquisitions": 0, "stop": False}
    errors: list[BaseException] = []
    sessions = [contender.open() for _ in range(waiters)]
    began = time.perf_counter()

    def taken_since(acquisitions: int) -> bool:
        return bool(state["stop"] or state["acquisitions"] > acquisitions)

    def work(session: Session) -> None:
        try:
            while True:
                handle = session.acquire(key)
                acquired = time.perf_counter()
                with mutex:
                    if state["released_at"] is not None:
                        samples.append(acquired - state["released_at"])
                        state["released_at"] = None
                    state["acquisitions"] += 1
                    mine = state["acquisitions"]
                    if len(samples) >= handoffs:
                        state["stop"] = True
                    stop = state["stop"]
                    mutex.notify_all()
                if not stop:
                    time.sleep(hold)  # the previous holder settles into waiting
                with mutex:
                    state["released_at"] = time.perf_counter()
                session.release(handle)
                with mutex:
                    mutex.wait_for(functools.partial(taken_since, mine), timeout=30)
                    if state["stop"]:
                        return
        except BaseException as exc:
            errors.append(exc)
            with mutex:
                state["stop"] = True
                mutex.notify_all()

    threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for session in sessions:
        session.close()
    if errors:
        raise errors[0]
    return Handoff(Latency(samples or [math.nan]), len(samples), time.perf_counter() - began)


def async_handoff(
    locks: Any, key: str, *, waiters: int, handoffs: int, hold: float, wait: float
) -> Handoff:
    """:func:`handoff` for coroutines: ``waiters`` tasks of one event loop contend for ``key``
    through ``aacquire(wait=...)``; each holder keeps it ``hold`` seconds, notes the time and
    awaits ``arelease()``; then contends again once another task took the lock."""
    samples: list[float] = []
    state: dict[str, Any] = {"released_at": None, "acquisitions": 0, "stop": False}

    def taken_since(acquisitions: int) -> bool:
        return bool(state["stop"] or state["acquisitions"] > acquisitions)

    async def main() -> None:
        changed = asyncio.Condition()

        async def work() -> None:
            while True:
                lock = await locks.aacquire(key, wait=wait)
                if lock is None:
                    raise RuntimeError(f"{key!r} stayed taken for {wait}s")
                acquired = time.perf_counter()
                async with changed:
                    if state["released_at"] is not None:
                        samples.append(acquired - state["released_at"])
                        state["released_at"] = None
                    state["acquisitions"] += 1
                    mine = state["acquisitions"]
                    if len(samples) >= handoffs:
                        state["stop"] = True
                    stop = state["stop"]
                    changed.notify_all()
                if not stop:
                    await asyncio.sleep(hold)  # the previous holder settles into waiting
                state["released_at"] = time.perf_counter()
                await lock.arelease()
                async with changed:
                    await changed.wait_for(functools.partial(taken_since, mine))
                    if state["stop"]:
                        return

        await asyncio.wait_for(asyncio.gather(*(work() for _ in range(waiters))), 300)

    began = time.perf_counter()
    asyncio.run(main())
    return Handoff(Latency(samples or [math.nan]), len(samples), time.perf_counter() - began)


def best_of(repeat: int, number: int, call: Callable[[], object]) -> float:
    """Seconds per call of ``call``: the best of ``repeat`` runs of ``number`` calls."""
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            call()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def ratio(value: float, floor: float) -> str:
    return f"{value / floor:.2f}x" if floor > 0 else "-"


def us(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    if seconds >= 0.01:
        return f"{seconds * 1e3:,.1f} ms"
    return f"{seconds * 1e6:,.0f} us"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """Rows under headers; the first ``left`` columns aligned left, the others right."""
    widths = [
        max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)
    ]

    def line(cells: Sequence[str]) -> str:
        return (
            "  "
            + "  ".join(
                str(cell).ljust(width) if index < left else str(cell).rjust(width)
                for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
