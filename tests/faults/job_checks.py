"""The checker's part for the ``replace`` and ``max_hold`` scenarios (SPEC section 12: "What a
conflict does", ``"replace"``; "A cap on holding"), on the events of tests/faults/jobs.py.

A preempt request is a ``preempt`` event naming a token; a preemption an ``aborted`` event with
``by="preempted"``. Violations:

* ``stale_preempt``: a holder preempted although no request named its token before (a request
  for another token, one that ended, preempted the next holder);
* ``preempt_lost``: ``lock_lost`` sent for a preemption (``by="preempted"``, or any loss of a
  token that was preempted);
* ``preempt_reason``: a signal aborted ``by="preempted"`` with another class than
  ``PreemptedError``, or naming another token;
* ``preempt_ignored``: a renewal of a token confirmed after a request for it was written (a
  deadline later than the request's end + ttl: that renewal was sent after it);
* ``preempt_missed``: a holder asked to go, with no fault on its process, neither preempted
  nor gone within ttl/3 + ``NOTICE_MARGIN`` of the request, or refused a renewal instead;
* ``stale_target``: a request named a token that had ended before the call began (a greater
  token of the key had been acquired, or its holder's release had been confirmed);
* ``max_hold_timing``: a lock taken with ``max_hold`` whose signal aborted ``by="max_hold"``
  before ``max_hold`` or later than ``CAP_MARGIN`` after it, or never while it was held;
* ``max_hold_unannounced``: a capped lock without ``lock_lost(detected_by="max_hold")`` (unless
  its worker exited within ``CAP_MARGIN`` of the cap, at the end of its run);
* ``max_hold_takeover``: after a cap, the key taken again before the lease's ttl from the
  abort (the ttl is the work's time to stop), or not within max_hold + ttl + ``TAKE_MARGIN``
  of the acquire although another worker waited for it all that time.

Figures (``Report.jobs`` counts, ``Report.samples``): ``notice_s`` request to preemption,
``replaced_s`` request to the replacing run's acquire, ``cap_late_ms`` signal abort after
acquire + max_hold, ``announce_ms`` abort to ``lock_lost``, ``taken_s`` acquire of a capped
lock to the next holder's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.faults.checker import Report

JOB_VIOLATIONS = (
    "stale_preempt",
    "preempt_lost",
    "preempt_reason",
    "preempt_ignored",
    "preempt_missed",
    "stale_target",
    "max_hold_timing",
    "max_hold_unannounced",
    "max_hold_takeover",
)
NOTICE_MARGIN = 0.5
"""Seconds past ttl/3 (the renewal period) for a holder to see a request: a busy machine's."""
CAP_MARGIN = 0.5
"""Seconds past max_hold for the signal to abort."""
TAKE_MARGIN = 2.0
"""Seconds past max_hold + ttl for the next holder: a waiter's backoff (up to 1 s) and more."""
INTERFERING = {"holder_pause", "holder_kill", "hung_connection"}
"""The faults that excuse a holder from noticing a request in time."""

Ident = tuple[str, int]  # key, token


def job_figures(samples: dict[str, list[float]]) -> dict[str, float]:
    """``<sample>_p50``, ``_p99`` and ``_max`` of each sample."""
    from tests.faults.checker import percentile

    return {
        f"{name}_{q}": round(
            percentile(values, 50 if q == "p50" else 99) if q != "max" else max(values), 3
        )
        for name, values in sorted(samples.items())
        for q in ("p50", "p99", "max")
    }


def job_summary(report: Report) -> str:
    """The summary line's part: the counts, then each sample's figures."""
    figures = job_figures(report.samples)
    counts = " ".join(f"{k}={v}" for k, v in sorted(report.jobs.items()))
    samples = " ".join(
        f"{name} p50={figures[name + '_p50']:g} p99={figures[name + '_p99']:g} "
        f"max={figures[name + '_max']:g} (n={len(values)})"
        for name, values in sorted(report.samples.items())
    )
    return f"{counts} | {samples}" if samples else counts


def check_jobs(by_kind: dict[str, list[dict[str, Any]]], report: Report) -> None:
    jobs = (
        by_kind["preempt"] or by_kind["aborted"] or any(ok.get("max_hold") for ok in by_kind["ok"])
    )
    if not jobs:
        return
    report.jobs_run = True
    facts = Facts(by_kind)
    _preemptions(by_kind, facts, report)
    if by_kind["preempt"]:
        _requests(by_kind, facts, report)
    _caps(by_kind, facts, report)


class Facts:
    """What the history says of each token: its acquire, the first instant of each way it
    ended, the greatest deadline it had, its holder's faults."""

    def __init__(self, by_kind: dict[str, list[dict[str, Any]]]) -> None:
        self.ok: dict[Ident, dict[str, Any]] = {(e["key"], e["token"]): e for e in by_kind["ok"]}
        self.aborted: dict[Ident, dict[str, Any]] = {}
        for event in sorted(by_kind["aborted"], key=lambda e: e["t"]):
            self.aborted.setdefault((event["key"], event["token"]), event)
        self.lost: dict[Ident, list[dict[str, Any]]] = defaultdict(list)
        for event in by_kind["lost"]:
            self.lost[(event["key"], event["token"])].append(event)
        self.release = _first(by_kind["release"])
        self.exit = {event["pid"]: event["t"] for event in by_kind["exit"]}
        # Left with the release confirmed: the lease was gone (a lost lock's lease lapses later).
        self.left = _first([e for e in by_kind["left"] if e.get("released")])
        self.deadline: dict[Ident, float] = {}
        for name in ("ok", "deadline", "release"):
            for event in by_kind[name]:
                ident = (event["key"], event["token"])
                self.deadline[ident] = max(self.deadline.get(ident, -math.inf), event["deadline"])
        self.faults: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.death: dict[int, float] = {}
        for fault in by_kind["fault"]:
            if fault["kind"] in INTERFERING and fault.get("pid") is not None:
                self.faults[fault["pid"]].append((fault["start"], fault["end"]))
            if fault["kind"] == "holder_kill":
                self.death[fault["pid"]] = fault["start"]
        self.oks_of: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for event in sorted(by_kind["ok"], key=lambda e: e["t"]):
            self.oks_of[event["key"]].append(event)

    def faulted(self, pid: int, start: float, end: float) -> bool:
        return any(f_start <= end and f_end >= start for f_start, f_end in self.faults[pid])

    def ended(self, ident: Ident) -> float:
        """The first instant it ended otherwise than preempted: released, lost, killed."""
        lost = min((e["t"] for e in self.lost[ident]), default=math.inf)
        death = self.death.get(self.ok[ident]["pid"], math.inf) if ident in self.ok else math.inf
        return min(self.release.get(ident, math.inf), lost, death)


def _first(events: list[dict[str, Any]]) -> dict[Ident, float]:
    first: dict[Ident, float] = {}
    for event in events:
        ident = (event["key"], event["token"])
        first[ident] = min(first.get(ident, math.inf), event["t"])
    return first


def _violation(report: Report, name: str, detail: str) -> None:
    report.violations[name] += 1
    report.details.append(f"{name}: {detail}")


def _preemptions(by_kind: dict[str, list[dict[str, Any]]], facts: Facts, report: Report) -> None:
    asked: dict[Ident, float] = {}  # the earliest start of a request naming each token
    for request in by_kind["preempt"]:
        if request["token"] is not None:
            ident = (request["key"], request["token"])
            asked[ident] = min(asked.get(ident, math.inf), request["start"])
    for (key, token), event in facts.aborted.items():
        preempted = event["by"] == "preempted"
        if preempted != (event["reason"] == "PreemptedError") or (
            preempted and event["reason_token"] != token
        ):
            _violation(
                report,
                "preempt_reason",
                f"token {token} of {key!r} (pid {event['pid']}) aborted by {event['by']} with "
                f"{event['reason']} naming token {event['reason_token']}",
            )
        if not preempted:
            continue
        report.jobs["preempted"] += 1
        if asked.get((key, token), math.inf) >= event["t"]:
            _violation(
                report,
                "stale_preempt",
                f"token {token} of {key!r} (pid {event['pid']}) preempted at {event['t']:.3f} "
                f"with no request for it before",
            )
        for loss in facts.lost[(key, token)]:
            _violation(
                report,
                "preempt_lost",
                f"lock_lost({loss['by']}) for token {token} of {key!r}, preempted at "
                f"{event['t']:.3f}",
            )
    preempted = {ident for ident, event in facts.aborted.items() if event["by"] == "preempted"}
    for loss in by_kind["lost"]:
        if loss["by"] == "preempted" and (loss["key"], loss["token"]) not in preempted:
            _violation(report, "preempt_lost", f"lock_lost(preempted) for token {loss['token']}")


def _requests(by_kind: dict[str, list[dict[str, Any]]], facts: Facts, report: Report) -> None:
    report.jobs["preempt_calls"] += len(by_kind["preempt"])
    first: dict[Ident, dict[str, Any]] = {}
    for request in sorted(by_kind["preempt"], key=lambda e: e["end"]):
        token, key = request["token"], request["key"]
        if token is None:
            continue
        report.jobs["requests"] += 1
        ident = (key, token)
        first.setdefault(ident, request)
        newer = [
            ok for ok in facts.oks_of[key] if ok["token"] > token and ok["t"] < request["start"]
        ]
        if newer or facts.left.get(ident, math.inf) < request["start"]:
            _violation(
                report,
                "stale_target",
                f"a request from pid {request['pid']} at {request['start']:.3f} named token "
                f"{token} of {key!r}, which had ended",
            )
        holder = facts.ok.get(ident)
        if holder is not None and facts.deadline[ident] > request["end"] + holder["ttl"]:
            _violation(
                report,
                "preempt_ignored",
                f"token {token} of {key!r} (pid {holder['pid']}) renewed to "
                f"{facts.deadline[ident]:.3f} after a request for it ended at "
                f"{request['end']:.3f}",
            )
    for ident, request in first.items():
        holder = facts.ok.get(ident)
        if holder is None:
            continue  # a holder killed before it recorded its acquire
        pid, key, token = holder["pid"], *ident
        bound = request["end"] + holder["ttl"] / 3 + NOTICE_MARGIN
        event = facts.aborted.get(ident)
        noticed = event["t"] if event is not None and event["by"] == "preempted" else math.inf
        if facts.faulted(pid, request["start"] - 0.1, bound):
            continue
        if noticed < math.inf:
            report.samples["notice_s"].append(noticed - request["end"])
        refused = [e for e in facts.lost[ident] if e["by"] == "renewal" and e["t"] < noticed]
        if refused or min(noticed, facts.ended(ident)) > bound:
            how = f"refused a renewal at {refused[0]['t']:.3f}" if refused else "held on"
            _violation(
                report,
                "preempt_missed",
                f"token {token} of {key!r} (pid {pid}) {how} after a request ended at "
                f"{request['end']:.3f} (preempted at {noticed:.3f})",
            )
    for ok in by_kind["ok"]:
        if ok.get("asked_at") is not None:
            report.samples["replaced_s"].append(ok["t"] - ok["asked_at"])
    report.jobs["not_replaced"] += sum(e.get("code") == "not_replaced" for e in by_kind["fail"])


def _caps(by_kind: dict[str, list[dict[str, Any]]], facts: Facts, report: Report) -> None:
    invokes = by_kind["invoke"]
    for ok in by_kind["ok"]:
        max_hold = ok.get("max_hold")
        if not max_hold:
            continue
        ident, pid, ttl = (ok["key"], ok["token"]), ok["pid"], ok["ttl"]
        key, token = ident
        report.jobs[f"job_{ok.get('job')}"] += 1
        event = facts.aborted.get(ident)
        if event is None or event["by"] != "max_hold":
            if facts.ended(ident) > ok["t"] + max_hold + CAP_MARGIN:
                _violation(
                    report,
                    "max_hold_timing",
                    f"token {token} of {key!r} (pid {pid}) held from {ok['t']:.3f} past its "
                    f"max_hold of {max_hold:g}s without its signal aborting",
                )
            continue
        report.jobs["capped"] += 1
        late = event["t"] - (ok["t"] + max_hold)
        report.samples["cap_late_ms"].append(late * 1000)
        if event["t"] < ok["sent"] + max_hold or late > CAP_MARGIN:
            _violation(
                report,
                "max_hold_timing",
                f"token {token} of {key!r} (pid {pid}) acquired at {ok['t']:.3f} aborted by "
                f"max_hold ({max_hold:g}s) at {event['t']:.3f}",
            )
        announced = [e for e in facts.lost[ident] if e["by"] == "max_hold"]
        if announced:
            report.samples["announce_ms"].append((announced[0]["t"] - event["t"]) * 1000)
        elif facts.exit.get(pid, math.inf) > event["t"] + CAP_MARGIN:
            # Unless the worker's run ended right after the cap: the announcement follows the
            # last renewal's answer, and the process had exited.
            _violation(
                report,
                "max_hold_unannounced",
                f"token {token} of {key!r} (pid {pid}) capped at {event['t']:.3f}, no lock_lost",
            )
        nxt = next((o for o in facts.oks_of[key] if o["t"] > event["t"]), None)
        if nxt is not None:
            report.samples["taken_s"].append(nxt["t"] - ok["t"])
        due = ok["t"] + max_hold + ttl + TAKE_MARGIN
        waited = any(
            inv["key"] == key
            and inv["pid"] != pid
            and inv["t"] <= ok["t"] + max_hold + ttl
            and inv["t"] + inv["wait"] >= due
            for inv in invokes
        )
        if nxt is not None and nxt["t"] < event["t"] + ttl - 0.05:
            what = f"taken by token {nxt['token']} at {nxt['t']:.3f}, before its ttl"
        elif waited and (nxt is None or nxt["t"] > due):
            what = "not taken in time" if nxt is None else f"taken only at {nxt['t']:.3f}"
        else:
            continue
        _violation(
            report,
            "max_hold_takeover",
            f"token {token} of {key!r} acquired at {ok['t']:.3f}, capped at {event['t']:.3f}: "
            f"{what}",
        )
