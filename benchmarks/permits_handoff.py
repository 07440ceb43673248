"""The permits handoff (``python -m benchmarks --permits``, issue 22): what woke each next holder.

``WAITERS`` threads share the ``PERMITS`` permits of one key through ``acquire(wait=...)``. Each
handoff (an acquisition that follows a release) is classed by what ended its acquirer's last
pause: a release notice (the store's ``wait_for_release`` answered ``True``), a backoff step (it
answered ``False``: the pause ran out), or no pause at all (the first try got a permit).
:class:`NoticeRecorder` records it by putting a wrapper of ``wait_for_release`` on the store
object itself (an instance attribute over the method): the service and the store run their own
code, plus one thread-local write per call.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from benchmarks.measure import Latency, table, us

PERMITS = 3
WAITERS = 8
WAIT_S = 30.0


def say(text: str = "") -> None:
    print(text, flush=True)


class NoticeRecorder:
    """Records, per thread, what the store's ``wait_for_release`` last answered: installed on
    the store object (an instance attribute over the method, the one the service's pauses call),
    taken off by :meth:`close`. Nothing else about the store changes."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._wait = store.wait_for_release
        self._local = threading.local()
        store.wait_for_release = self._recorded

    def _recorded(self, key: str, timeout: float) -> bool:
        self._local.last = "error"  # kept when the call raises (a failing notice channel)
        try:
            answer: bool = self._wait(key, timeout)
        except NotImplementedError:
            self._local.last = "backoff"  # no notices: the pause is slept through
            raise
        self._local.last = "notice" if answer else "backoff"
        return answer

    def begin(self) -> None:
        """Before this thread's acquire."""
        self._local.last = "no pause"

    def outcome(self) -> str:
        """After it: ``"notice"``, ``"backoff"``, ``"no pause"`` or ``"error"``."""
        return str(getattr(self._local, "last", "no pause"))

    def close(self) -> None:
        vars(self.store).pop("wait_for_release", None)


def permits_handoff(
    locks: Any, key: str, *, handoffs: int, hold: float
) -> tuple[Latency, collections.Counter[str]]:
    """``WAITERS`` threads take one of ``PERMITS`` permits of ``key`` through
    ``acquire(wait=...)``; each holder keeps it ``hold`` seconds, notes the time and releases
    it, then contends again once every release so far was handed off (holders that took their
    permits together release them together: a holder contending again at once would take a
    permit released beside its own without waiting), so that every handoff goes to a thread
    that was waiting. The acquisitions matched to a release (in order) are the handoffs: the
    time from that release, and what woke the acquirer."""
    recorder = NoticeRecorder(locks.store)
    mutex = threading.Condition()
    released: collections.deque[float] = collections.deque()  # releases not handed off yet
    state = {"handoffs": 0, "stop": False}
    samples: list[float] = []
    woken: collections.Counter[str] = collections.Counter()
    errors: list[BaseException] = []

    def handed_off() -> bool:
        return bool(state["stop"] or not released)

    def work() -> None:
        try:
            while True:
                recorder.begin()
                lock = locks.acquire(key, permits=PERMITS, wait=WAIT_S)
                acquired = time.perf_counter()
                if lock is None:
                    raise RuntimeError(f"no permit of {key!r} for {WAIT_S}s")
                with mutex:
                    if released and not state["stop"]:
                        samples.append(acquired - released.popleft())
                        woken[recorder.outcome()] += 1
                        state["handoffs"] += 1
                        state["stop"] = state["handoffs"] >= handoffs
                        mutex.notify_all()
                    stop = state["stop"]
                if not stop:
                    time.sleep(hold)
                with mutex:
                    released.append(time.perf_counter())
                lock.release()
                with mutex:
                    mutex.wait_for(handed_off, timeout=WAIT_S)
                    if state["stop"]:
                        return
        except BaseException as exc:
            errors.append(exc)
            with mutex:
                state["stop"] = True
                mutex.notify_all()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(WAITERS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=WAIT_S * 4)
    finally:
        recorder.close()
    if errors:
        raise errors[0]
    return Latency(samples or [float("nan")]), woken


def section_handoff(
    store_name: str, locks: Any, *, handoffs: int, hold: float, note: str = ""
) -> dict[str, Any]:
    key = f"bench:permits:handoff:{store_name}{note and ':again'}"
    began = time.perf_counter()
    latency, woken = permits_handoff(locks, key, handoffs=handoffs, hold=hold)
    seconds = time.perf_counter() - began
    total = sum(woken.values())
    share = woken["notice"] / total if total else 0.0
    say(
        f"Handoff: {WAITERS} threads, {PERMITS} permits of one key, each holder keeping its "
        f"permit {hold * 1e3:g} ms{note} ({total} handoffs in {seconds:.1f}s); what woke each "
        "next holder, and the time from the release:"
    )
    say(
        table(
            ["release notice", "backoff step", "no pause", "error", "by notice", "median", "p99"],
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
    say()
    return {
        "handoffs": total,
        "woken": {name: woken[name] for name in ("notice", "backoff", "no pause", "error")},
        "notice_share": round(share, 4),
        "latency": latency.as_dict(),
        "hold_s": hold,
    }
