"""The fault suite's checker: reads a history (JSON-lines events, ``time.monotonic()`` instants
of one machine) and counts violations of SPEC section 6.

Events (``e``) the workers write: ``invoke``, ``ok`` (key, token, owner, deadline), ``deadline``
(a renewal moved it), ``lost`` (key, token, by, deadline: the instant the ``lock_lost`` signal
was sent), ``release`` (the instant the holder let go, with its deadline then), ``write`` (kind
``claim`` / ``fenced`` / ``canary`` / ``leader``, key, token, start, end, accepted, value). The
harness adds ``fault`` (kind, pid, key, start, end) and, at the end, ``counter`` (kind, key,
value). Each worker's events are in its own order; instants order them across processes.

A holder's *validity window* runs from the instant ``acquire`` returned to the earliest of its
deadline, its loss, its release and its death. A window that ends before it starts is empty (the
"OK" came back after the deadline: it must not count). Violations:

* ``overlap``: two non-empty windows of one key overlap (P2: the holder deadline ends no later
  than the store's expiry, so the next holder starts after it);
* ``token_order``: in window order, a key's tokens do not strictly increase (P1);
* ``duplicate_token``: two owners of one key got the same token (P1);
* ``stale_write``: a fenced write was accepted after a write with a greater token to the same row
  had finished (P4);
* ``fenced_lost``: accepted fenced increments that the counter does not show (P4 for a
  read-modify-write: claim, read, write, each fenced);
* ``over_permits``: moments when more than N non-empty windows of a key taken with permits=N
  were open at once (SPEC section 12): each window start that leaves more than N open counts
  one; so does a window naming a permit outside 1..N.

With permits (an ``ok`` names its ``permit`` and ``permits``), each permit is checked as a lock
of its own: ``overlap``, ``token_order``, ``stale_write`` and ``fenced_lost`` per slot (the
windows and rows of ``<key>#<permit>``, the resource its token fences), ``duplicate_token``
across every slot of the key (its one sequence), and ``over_permits`` over the key's windows
whatever permit they name.

The ``replace`` and ``max_hold`` scenarios' own violations and figures (preempt requests,
preemptions, caps, the takeover after a cap) are tests/faults/job_checks.py's; the atomic
canary's (``atomic_canary_lost``, how its blocks ended, the store acquire calls' times) are
tests/faults/atomic_checks.py's; the lateness and takeover figures tests/faults/figures.py's.

Figures: lateness of ``deadline`` losses (loss instant minus deadline, leaving out processes that
were stopped at their deadline), takeover after a holder crash (kill to the next holder's
``ok`` or accepted write; on etcd also minus P5's bound there, ``p5_excess``), the longest a key
went without a valid holder between two of its holders (``gap_max``), and the canary's lost
updates (unfenced, expected above zero whenever a fault really hit).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.atomic_checks import ATOMIC_VIOLATIONS, atomic_summary, check_atomic
from tests.faults.figures import CRASHES, lateness, longest_gap, takeover
from tests.faults.job_checks import JOB_VIOLATIONS, check_jobs, job_figures, job_summary

BASE_VIOLATIONS = (
    "overlap",
    "token_order",
    "duplicate_token",
    "stale_write",
    "fenced_lost",
    "over_permits",
)
VIOLATIONS = BASE_VIOLATIONS + ATOMIC_VIOLATIONS + JOB_VIOLATIONS


@dataclass
class Window:
    key: str
    token: int
    pid: int
    start: float
    end: float
    permit: int | None = None
    permits: int = 1

    @property
    def empty(self) -> bool:
        return self.end <= self.start

    @property
    def slot(self) -> str:
        """What must not overlap: the key, or with permits the permit's slot ``<key>#<n>``."""
        return self.key if self.permit is None else f"{self.key}#{self.permit}"


@dataclass
class Report:
    operations: int = 0
    acquisitions: int = 0
    late_oks: int = 0
    writes: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    details: list[str] = field(default_factory=list)
    lost_by: Counter[str] = field(default_factory=Counter)
    lateness: list[float] = field(default_factory=list)
    takeover: list[float] = field(default_factory=list)
    crashes: list[tuple[float, float, str]] = field(default_factory=list)  # kill, takeover, slot
    p5_excess: list[float] = field(default_factory=list)  # etcd: takeover minus P5's bound
    p5_held: list[float] = field(default_factory=list)  # etcd: last refused try minus the bound
    gap_max: float = 0.0  # seconds: the longest a key went without a valid holder in between
    canary_lost: int = 0
    refused_fenced: int = 0
    peak_holders: int = 0  # the most valid holders of one permits key at once
    jobs_run: bool = False  # replace / max_hold events: tests/faults/job_checks.py's figures
    jobs: Counter[str] = field(default_factory=Counter)
    samples: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    atomic: Counter[str] = field(default_factory=Counter)  # tests/faults/atomic_checks.py's
    acquire_calls: list[float] = field(default_factory=list)  # seconds each store acquire took
    pending_waits: list[float] = field(default_factory=list)  # those during another's commit

    @property
    def ok(self) -> bool:
        return not any(self.violations[name] for name in VIOLATIONS)

    def figures(self) -> dict[str, Any]:
        return {
            "lateness_p50_ms": _ms(percentile(self.lateness, 50)),
            "lateness_p99_ms": _ms(percentile(self.lateness, 99)),
            "lateness_max_ms": _ms(max(self.lateness, default=math.nan)),
            "takeover_p50_s": _round(percentile(self.takeover, 50)),
            "takeover_p99_s": _round(percentile(self.takeover, 99)),
            "takeover_max_s": _round(max(self.takeover, default=math.nan)),
            "p5_excess_max_s": _round(max(self.p5_excess, default=math.nan)),
            "p5_held_max_s": _round(max(self.p5_held, default=math.nan)),
            "gap_max_s": _round(self.gap_max),
        }

    def summary(self, label: str = "") -> str:
        f = self.figures()
        faults = ",".join(f"{k}:{v}" for k, v in sorted(self.faults.items())) or "none"
        names = VIOLATIONS if self.jobs_run else BASE_VIOLATIONS
        violations = " ".join(f"{name}={self.violations[name]}" for name in names)
        lost = ",".join(f"{k}:{v}" for k, v in sorted(self.lost_by.items())) or "none"
        return (
            f"{label}{'OK' if self.ok else 'VIOLATIONS'} ops={self.operations} "
            f"acquired={self.acquisitions} late_ok={self.late_oks} writes={self.writes} "
            f"refused_fenced={self.refused_fenced} faults={faults} | {violations} | "
            f"lost={lost} lateness_ms p50={f['lateness_p50_ms']} p99={f['lateness_p99_ms']} "
            f"max={f['lateness_max_ms']} (n={len(self.lateness)}) | takeover_s "
            f"p50={f['takeover_p50_s']} p99={f['takeover_p99_s']} (n={len(self.takeover)}) | "
            f"canary_lost_updates={self.canary_lost} | gap_max_s={f['gap_max_s']}"
            + (f" | peak_holders={self.peak_holders}" if self.peak_holders else "")
            + (
                f" | p5_excess_max_s={f['p5_excess_max_s']} p5_held_max_s={f['p5_held_max_s']}"
                if self.p5_excess
                else ""
            )
            + (f" | {atomic_summary(self)}" if self.atomic else "")
            + (f" | {job_summary(self)}" if self.jobs_run else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "operations": self.operations,
            "acquisitions": self.acquisitions,
            "late_oks": self.late_oks,
            "writes": self.writes,
            "refused_fenced": self.refused_fenced,
            "faults": dict(self.faults),
            "violations": {name: self.violations[name] for name in VIOLATIONS},
            "lost_by": dict(self.lost_by),
            "canary_lost": self.canary_lost,
            "peak_holders": self.peak_holders,
            "jobs": dict(self.jobs),
            "atomic": dict(self.atomic),
            "atomic_canary_lost": self.violations["atomic_canary_lost"],
            "acquire_call_max_ms": _ms(max(self.acquire_calls, default=math.nan)),
            "acquire_call_p99_ms": _ms(percentile(self.acquire_calls, 99)),
            "pending_wait_max_ms": _ms(max(self.pending_waits, default=math.nan)),
            "pending_wait_n": len(self.pending_waits),
            **job_figures(self.samples),
            "lateness_n": len(self.lateness),
            "takeover_n": len(self.takeover),
            **self.figures(),
            "details": self.details[:50],
        }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _ms(value: float) -> float:
    return value if math.isnan(value) else round(value * 1000, 1)


def _round(value: float) -> float:
    return value if math.isnan(value) else round(value, 3)


def read_history(paths: Iterable[Path]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if line:
                    try:
                        events.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # the last line of a killed worker may be cut
    return events


def check(events: list[dict[str, Any]]) -> Report:
    report = Report()
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_kind[event["e"]].append(event)
    report.operations = sum(len(by_kind[k]) for k in ("invoke", "write"))
    report.writes = len(by_kind["write"])
    for fault in by_kind["fault"]:
        report.faults[fault["kind"]] += 1

    windows = _windows(by_kind, report)
    _check_windows(windows, report)
    _check_permits(windows, report)
    _check_duplicates(by_kind["ok"], report)
    _check_writes(by_kind["write"], report)
    _check_counters(by_kind["write"], by_kind["counter"], report)
    late = {(w.pid, w.key, w.token) for w in windows if w.empty}
    lateness(by_kind["lost"], by_kind["fault"], late, report)
    takeover(by_kind, report)
    longest_gap(windows, report)
    check_atomic(by_kind, report)
    check_jobs(by_kind, report)
    return report


def _windows(by_kind: dict[str, list[dict[str, Any]]], report: Report) -> list[Window]:
    ends: dict[tuple[int, str, int], float] = {}
    deadlines: dict[tuple[int, str, int], float] = {}

    def end_at(ident: tuple[int, str, int], instant: float) -> None:
        ends[ident] = min(ends.get(ident, math.inf), instant)

    for name in ("ok", "deadline"):
        for event in by_kind[name]:
            ident = (event["pid"], event["key"], event["token"])
            deadlines[ident] = max(deadlines.get(ident, -math.inf), event["deadline"])
    for name in ("lost", "release"):
        for event in by_kind[name]:
            ident = (event["pid"], event["key"], event["token"])
            end_at(ident, event["t"])
            if event.get("deadline") is not None:  # the final deadline, when it was known
                deadlines[ident] = event["deadline"]
    deaths = {f["pid"]: f["start"] for f in by_kind["fault"] if f["kind"] in CRASHES}
    windows = []
    for event in by_kind["ok"]:
        ident = (event["pid"], event["key"], event["token"])
        end = min(ends.get(ident, math.inf), deadlines[ident], deaths.get(event["pid"], math.inf))
        window = Window(
            event["key"],
            event["token"],
            event["pid"],
            event["t"],
            end,
            event.get("permit"),
            event.get("permits") or 1,
        )
        report.acquisitions += 1
        if window.empty:
            report.late_oks += 1
        windows.append(window)
    # run_leader processes log only their writes. Each accepted write took effect at some instant
    # between its start and its end, so a term (one process, one token) certainly ran from the
    # end of its first accepted write to the start of its last: that span is its window. (The
    # outer span is not: a leader stopped in the middle of a write stamps its end when it runs
    # again, long after the write took effect.)
    terms: dict[tuple[int, str, int], list[float]] = {}
    for write in by_kind["write"]:
        if write["kind"] == "leader" and write["accepted"]:
            ident = (write["pid"], write["key"], write["token"])
            span = terms.setdefault(ident, [write["end"], write["start"]])
            span[0], span[1] = min(span[0], write["end"]), max(span[1], write["start"])
    for (pid, key, token), (start, end) in terms.items():
        windows.append(Window(key, token, pid, start, end))
        report.acquisitions += 1
    return windows


def _check_windows(windows: list[Window], report: Report) -> None:
    per_key: dict[str, list[Window]] = defaultdict(list)
    for window in windows:
        if not window.empty:
            per_key[window.slot].append(window)
    for key, held in per_key.items():
        held.sort(key=lambda w: w.start)
        latest: Window | None = None
        top_token = -1
        for window in held:
            if latest is not None and window.start < latest.end:
                report.violations["overlap"] += 1
                report.details.append(
                    f"overlap on {key!r}: token {latest.token} (pid {latest.pid}) valid until "
                    f"{latest.end:.3f}, token {window.token} (pid {window.pid}) from "
                    f"{window.start:.3f}"
                )
            if window.token <= top_token:
                report.violations["token_order"] += 1
                report.details.append(
                    f"token order on {key!r}: {window.token} acquired at {window.start:.3f} "
                    f"after {top_token}"
                )
            top_token = max(top_token, window.token)
            if latest is None or window.end > latest.end:
                latest = window


def _check_permits(windows: list[Window], report: Report) -> None:
    """Sweep each permits key's windows in time order, counting the open ones (a window ending
    at the instant another starts is closed first: validity ends before its deadline)."""
    per_key: dict[str, list[Window]] = defaultdict(list)
    for window in windows:
        if not window.empty and window.permit is not None:
            per_key[window.key].append(window)
    for key, held in per_key.items():
        limit = min(w.permits for w in held)
        for w in held:
            if not 1 <= (w.permit or 0) <= limit:
                report.violations["over_permits"] += 1
                report.details.append(
                    f"permit {w.permit} of {key!r} (permits={limit}): token {w.token} "
                    f"(pid {w.pid}) at {w.start:.3f}"
                )
        steps = sorted(
            [(w.start, 1, i) for i, w in enumerate(held)]
            + [(w.end, 0, i) for i, w in enumerate(held)]
        )
        open_now: set[int] = set()
        for instant, starts, i in steps:
            if not starts:
                open_now.discard(i)
                continue
            open_now.add(i)
            report.peak_holders = max(report.peak_holders, len(open_now))
            if len(open_now) > limit:
                report.violations["over_permits"] += 1
                holders = ", ".join(
                    f"permit {held[j].permit} token {held[j].token} (pid {held[j].pid}) "
                    f"{held[j].start:.3f}..{held[j].end:.3f}"
                    for j in sorted(open_now, key=lambda j: held[j].start)
                )
                report.details.append(
                    f"{len(open_now)} holders of {key!r} (permits={limit}) at {instant:.3f}: "
                    f"{holders}"
                )


def _check_duplicates(oks: list[dict[str, Any]], report: Report) -> None:
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    for event in oks:
        owners[(event["key"], event["token"])].add(event.get("owner") or str(event["pid"]))
    for (key, token), who in owners.items():
        if len(who) > 1:
            report.violations["duplicate_token"] += len(who) - 1
            report.details.append(f"token {token} of {key!r} went to {len(who)} owners")


FENCED = ("claim", "fenced", "leader")


def _check_writes(writes: list[dict[str, Any]], report: Report) -> None:
    per_row: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for write in writes:
        if write["kind"] in FENCED:
            if write["accepted"]:
                per_row[write["key"]].append(write)
            elif "error" not in write:
                report.refused_fenced += 1
    for key, accepted in per_row.items():
        # Sweep: every accepted write against the greatest token among the accepted writes that
        # had finished before it started.
        finished = sorted(accepted, key=lambda w: w["end"])
        i, top, top_write = 0, -1, None
        for write in sorted(accepted, key=lambda w: w["start"]):
            while i < len(finished) and finished[i]["end"] < write["start"]:
                if finished[i]["token"] > top:
                    top, top_write = finished[i]["token"], finished[i]
                i += 1
            if write["token"] < top:
                report.violations["stale_write"] += 1
                assert top_write is not None
                report.details.append(
                    f"stale write on {key!r}: token {write['token']} (pid {write['pid']}) "
                    f"accepted at {write['start']:.3f} after token {top} finished at "
                    f"{top_write['end']:.3f}"
                )


def _check_counters(
    writes: list[dict[str, Any]], counters: list[dict[str, Any]], report: Report
) -> None:
    increments: Counter[tuple[str, str]] = Counter()
    for write in writes:
        if write["kind"] in ("fenced", "canary") and write["accepted"]:
            increments[(write["kind"], write["key"])] += 1
    for counter in counters:
        lost = increments[(counter["kind"], counter["key"])] - counter["value"]
        if counter["kind"] == "fenced" and lost > 0:
            report.violations["fenced_lost"] += lost
            report.details.append(
                f"fenced counter {counter['key']!r} is {counter['value']} after "
                f"{increments[('fenced', counter['key'])]} accepted increments"
            )
        elif counter["kind"] == "canary":
            report.canary_lost += max(lost, 0)
