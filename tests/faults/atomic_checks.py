"""The checker's part for the atomic canary (tests/faults/atomic_canary.py): the canary's
read-modify-write inside ``lock.atomic()``, on the lock store's own database (SPEC section 13).

Violation ``atomic_canary_lost``: committed atomic increments that the atomic canary's counter
does not show. A block's every write commits before any next holder acquires the key, or not at
all, so none may be lost, whatever paused the holder.

Counts (``Report.atomic``): how the blocks ended, by the ``result`` of their ``write`` events
(``committed``; ``refused``, a ``LockLostError`` from ``lock.atomic()``, rolled back, which is
not a write; ``failed``, another error, the server ending the session of a block idle past its
ttl among them; ``rolled_back``, a delayed round's own block) and ``refused_entry``, blocks that
``lock.atomic()`` refused to open (the lock was no longer held).

Figures: ``Report.acquire_calls``, how long each store acquire call took (``acall`` events of
tests/faults/store.py), but for the calls during which the nemesis stopped the caller's own
process (a holder paused just as it asked for a key again: that time is the pause's);
``Report.pending_waits``, the same of the calls that overlapped another process's atomic block
of that key while it wrote and committed (from its write's send to the COMMIT's answer): a
competitor's wait on a pending conditional commit, when there was one, is in those calls.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from tests.faults.figures import PAUSES

if TYPE_CHECKING:
    from tests.faults.checker import Report

ATOMIC_VIOLATIONS = ("atomic_canary_lost",)
RESULTS = ("committed", "refused", "failed", "rolled_back", "refused_entry")


def check_atomic(by_kind: dict[str, list[dict[str, Any]]], report: Report) -> None:
    committed: Counter[str] = Counter()
    for write in by_kind["write"]:
        if write["kind"] == "atomic":
            report.atomic[write["result"]] += 1
            if write["accepted"]:
                committed[write["key"]] += 1
    if by_kind["atomic_refused_entry"]:
        report.atomic["refused_entry"] += len(by_kind["atomic_refused_entry"])
    for counter in by_kind["counter"]:
        if counter["kind"] != "atomic":
            continue
        lost = committed[counter["key"]] - counter["value"]
        if lost > 0:
            report.violations["atomic_canary_lost"] += lost
            report.details.append(
                f"atomic canary {counter['key']!r} is {counter['value']} after "
                f"{committed[counter['key']]} committed increments"
            )
    calls = [call for call in by_kind["acall"] if not _paused(call, by_kind["fault"])]
    report.acquire_calls.extend(call["took"] for call in calls)
    commits: defaultdict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for write in by_kind["write"]:
        if write["kind"] == "atomic" and write["result"] in ("committed", "refused"):
            commits[write["key"]].append((write["start"], write["end"], write["pid"]))
    for call in calls:
        sent, done = call["sent"], call["sent"] + call["took"]
        if any(
            start < done and sent < end and pid != call["pid"]
            for start, end, pid in commits.get(call["key"], ())
        ):
            report.pending_waits.append(call["took"])


def _paused(call: dict[str, Any], faults: list[dict[str, Any]]) -> bool:
    """The caller's own process was stopped during the call: its time is the pause's."""
    sent, done = call["sent"], call["sent"] + call["took"]
    return any(
        f.get("pid") == call["pid"] and f["start"] < done and sent < f["end"]
        for f in faults
        if f["kind"] in PAUSES
    )


def atomic_summary(report: Report) -> str:
    """The summary line's part: the blocks' ends, the lost updates, the acquire calls."""
    from tests.faults.checker import percentile

    ends = " ".join(f"atomic_{name}={report.atomic[name]}" for name in RESULTS)
    calls = report.acquire_calls
    figures = " ".join(
        f"{q}={_ms(value)}"
        for q, value in (
            ("p50", percentile(calls, 50)),
            ("p99", percentile(calls, 99)),
            ("max", max(calls, default=math.nan)),
        )
    )
    pending = _ms(max(report.pending_waits, default=math.nan))
    return (
        f"atomic_canary_lost={report.violations['atomic_canary_lost']} {ends} | "
        f"acquire_call_ms {figures} (n={len(calls)}) during_commit max={pending} "
        f"(n={len(report.pending_waits)})"
    )


def _ms(value: float) -> float:
    return value if math.isnan(value) else round(value * 1000, 1)
