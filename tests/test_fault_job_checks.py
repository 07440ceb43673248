"""The fault checker's replace and max_hold checks on small written histories: clean ones pass,
and each violation planted once is found once (tests/faults/job_checks.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.faults.checker import VIOLATIONS, check

TTL = 2.0


def deadline(t: float) -> float:
    return t + TTL * 0.99 - 0.005


def holder(
    pid: int,
    token: int,
    start: float,
    end: float,
    *,
    renewals: tuple[float, ...] = (),
    key: str = "k",
    **extra: Any,
) -> list[dict[str, Any]]:
    """A holder acquiring at ``start`` (sent 1 ms before), renewed at ``renewals``, leaving its
    block at ``end``."""
    base = {"pid": pid, "key": key, "token": token}
    last = deadline(max((start, *renewals)))
    return [
        {"e": "invoke", "t": start - 0.01, "pid": pid, "key": key, "wait": 0.0},
        {
            "e": "ok",
            "t": start,
            **base,
            "owner": f"o{token}",
            "deadline": deadline(start - 0.001),
            "sent": start - 0.001,
            "ttl": TTL,
            **extra,
        },
        *({"e": "deadline", "t": r + 0.01, **base, "deadline": deadline(r)} for r in renewals),
        {"e": "release", "t": end, **base, "deadline": last},
        {"e": "left", "t": end + 0.005, **base, "released": True},
    ]


def preempt(pid: int, token: int | None, start: float, key: str = "k") -> dict[str, Any]:
    return {"e": "preempt", "t": start + 0.002, "pid": pid, "key": key, "token": token,
            "start": start, "end": start + 0.002}  # fmt: skip


def aborted(
    pid: int, token: int, t: float, by: str = "preempted", reason: str = "PreemptedError"
) -> dict[str, Any]:
    return {"e": "aborted", "t": t, "pid": pid, "key": "k", "token": token, "by": by,
            "reason": reason, "reason_token": token}  # fmt: skip


def lost(pid: int, token: int, t: float, by: str) -> dict[str, Any]:
    return {"e": "lost", "t": t, "pid": pid, "key": "k", "token": token, "by": by,
            "deadline": None}  # fmt: skip


def only(report: Any, name: str) -> None:
    found = {v: report.violations[v] for v in VIOLATIONS if report.violations[v]}
    assert found == {name: 1}, (found, report.details)


# replace


def replaced() -> list[dict[str, Any]]:
    """Holder 10 asked to go at 1.0 by pid 2, preempted at 1.4, out at 1.45; pid 2 takes the
    key at 1.46 as token 11."""
    return [
        *holder(1, 10, 0.0, 1.45, renewals=(0.66,)),
        preempt(2, 10, 1.0),
        aborted(1, 10, 1.4),
        *holder(2, 11, 1.46, 2.0, asked_at=1.0, replacing=True),
    ]


def test_a_preempted_holder_giving_way_is_no_violation() -> None:
    report = check(replaced())
    assert report.ok, report.details
    assert report.jobs["preempted"] == 1 and report.jobs["requests"] == 1
    assert report.samples["notice_s"] == [pytest.approx(0.398)]
    assert report.samples["replaced_s"] == [pytest.approx(0.46)]
    summary = report.summary()
    assert "preempt_missed=0" in summary and "preempted=1 requests=1" in summary
    assert "notice_s p50=0.398" in summary


def test_a_request_for_the_previous_holder_preempts_the_next() -> None:
    # Pid 2 asked token 10 while it held; 10 left at 1.2, and 11 is preempted by that request.
    events = [
        *holder(1, 10, 0.0, 1.2),
        preempt(2, 10, 1.0),
        *holder(3, 11, 1.3, 2.0),
        aborted(3, 11, 1.6),
    ]
    only(check(events), "stale_preempt")


def test_lock_lost_sent_for_a_preemption() -> None:
    only(check([*replaced(), lost(1, 10, 1.41, "preempted")]), "preempt_lost")


def test_a_preemption_aborting_with_another_class() -> None:
    events = [e for e in replaced() if e["e"] != "aborted"]
    events.append(aborted(1, 10, 1.4, reason="LockLostError"))
    only(check(events), "preempt_reason")


def test_a_renewal_confirmed_after_the_request() -> None:
    # Renewed at 1.32 after the request of 1.0: its deadline 3.295 is past 1.002 + ttl.
    events = [
        *holder(1, 10, 0.0, 1.45, renewals=(0.66,)),
        preempt(2, 10, 1.0),
        {"e": "deadline", "t": 1.33, "pid": 1, "key": "k", "token": 10, "deadline": deadline(1.32)},
        aborted(1, 10, 1.4),
    ]
    only(check(events), "preempt_ignored")


def test_a_holder_that_never_sees_the_request() -> None:
    events = [*holder(1, 10, 0.0, 3.0, renewals=(0.66, 1.32, 1.98, 2.64)), preempt(2, 10, 0.7)]
    # Its renewals went on too (renewed to 4.615 after the request), which is also found.
    report = check(events)
    assert report.violations["preempt_missed"] == 1, report.details
    assert report.violations["preempt_ignored"] == 1
    # A holder paused meanwhile is excused from noticing in time (not from renewing after it).
    pause = {"e": "fault", "t": 3.0, "pid": 1, "kind": "holder_pause", "start": 0.5, "end": 3.0}
    report = check([*events, pause])
    assert report.violations["preempt_missed"] == 0, report.details


def test_a_holder_refused_a_renewal_instead_of_preempted() -> None:
    events = [
        *holder(1, 10, 0.0, 1.4, renewals=(0.66,)),
        preempt(2, 10, 1.0),
        aborted(1, 10, 1.33, by="renewal", reason="LockLostError"),
        lost(1, 10, 1.33, "renewal"),
    ]
    only(check(events), "preempt_missed")


def test_a_request_naming_a_token_that_had_ended() -> None:
    # Token 11 held the key since 1.3 when the request of 1.5 named 10.
    events = [*holder(1, 10, 0.0, 1.2), *holder(3, 11, 1.3, 2.0), preempt(2, 10, 1.5)]
    only(check(events), "stale_target")


def test_a_request_naming_a_token_whose_release_was_confirmed() -> None:
    events = [*holder(1, 10, 0.0, 1.2), preempt(2, 10, 1.3)]
    only(check(events), "stale_target")
    # A holder that lost its lock left its block without freeing the lease: still live, until
    # it lapses (the fault suite's PostgreSQL replace run 2, at 02d40f8, before this rule).
    for event in events:
        if event["e"] == "left":
            event["released"] = False
    assert check(events).ok


def test_a_request_finding_the_key_free_is_none() -> None:
    report = check([*holder(1, 10, 0.0, 1.0), preempt(2, None, 1.5)])
    assert report.ok, report.details
    assert report.jobs["preempt_calls"] == 1 and report.jobs["requests"] == 0


# max_hold


def capped(abort_at: float = 1.5, taken_at: float = 3.7) -> list[dict[str, Any]]:
    """Token 10 taken at 0.0 with max_hold=1.5 (a job that hangs), capped at ``abort_at``; pid 2
    waiting from 0.5 for 6 s takes the key at ``taken_at``."""
    return [
        *holder(1, 10, 0.0, 5.0, renewals=(0.66, 1.32), max_hold=1.5, job="hang"),
        aborted(1, 10, abort_at, by="max_hold", reason="LockLostError"),
        lost(1, 10, abort_at + 0.002, "max_hold"),
        {"e": "invoke", "t": 0.5, "pid": 2, "key": "k", "wait": 6.0},
        *holder(2, 11, taken_at, taken_at + 0.5)[1:],
    ]


def test_a_capped_holder_given_way_after_its_ttl_is_no_violation() -> None:
    report = check(capped())
    assert report.ok, report.details
    assert report.jobs["capped"] == 1 and report.jobs["job_hang"] == 1
    assert report.samples["cap_late_ms"] == [pytest.approx(0.0, abs=1e-6)]
    assert report.samples["announce_ms"] == [pytest.approx(2.0)]
    assert report.samples["taken_s"] == [pytest.approx(3.7)]
    assert report.as_dict()["taken_s_p99"] == 3.7


@pytest.mark.parametrize("abort_at", [1.2, 2.2])
def test_a_cap_too_early_or_too_late(abort_at: float) -> None:
    only(check(capped(abort_at=abort_at, taken_at=abort_at + 2.2)), "max_hold_timing")


def test_a_lock_held_past_its_max_hold() -> None:
    events = [e for e in capped() if e["e"] not in ("aborted", "lost") and e["pid"] == 1]
    only(check(events), "max_hold_timing")


def test_a_cap_without_lock_lost() -> None:
    events = [e for e in capped() if e["e"] != "lost"]
    only(check(events), "max_hold_unannounced")
    # Unless the worker exited at once (its run was over: nobody left to tell).
    report = check([*events, {"e": "exit", "t": 1.6, "pid": 1}])
    assert report.ok, report.details


def test_the_key_taken_before_the_capped_lease_lapsed() -> None:
    only(check(capped(taken_at=2.5)), "max_hold_takeover")


def test_the_key_not_taken_although_a_worker_waited() -> None:
    only(check(capped(taken_at=6.0)), "max_hold_takeover")
    events = [e for e in capped() if e["pid"] == 1 or e["e"] == "invoke"]
    only(check(events), "max_hold_takeover")
    # Nobody waiting that long: late is no violation.
    late = capped(taken_at=6.0)
    for event in late:
        if event["e"] == "invoke" and event["pid"] == 2:
            event["wait"] = 2.0
    assert check(late).ok


def test_the_docs_jobs_table_sums_the_counts_and_keeps_the_worst_figures() -> None:
    from tests.faults.table import table

    def result(scenario: str, jobs: dict[str, int], **figures: float) -> dict[str, Any]:
        base = {"scenario": scenario, "store": "redis", "operations": 10, "faults": {},
                "violations": {"overlap": 0}, "lost_by": {}, "refused_fenced": 0,
                "canary_lost": 0, "jobs": jobs}  # fmt: skip
        lateness = {f"lateness_{q}_ms": math.nan for q in ("p50", "p99", "max")}
        takeover = {f"takeover_{q}_s": math.nan for q in ("p50", "p99")}
        return base | lateness | takeover | figures

    results = [
        result("replace", {"preempted": 2}, notice_s_p50=0.4, notice_s_p99=0.6, notice_s_max=0.6),
        result("replace", {"preempted": 3}, notice_s_p50=0.3, notice_s_p99=0.7, notice_s_max=0.7),
        result("max_hold", {"capped": 4}, taken_s_p50=3.6, taken_s_p99=3.9, taken_s_max=3.9),
    ]
    replace, max_hold = table(results, jobs=True).split("\n\n.. list-table::")
    cells = [c.strip().removeprefix("- ") for c in replace.split("\n   * - ")[2].split("\n")]
    # Runs, operations, faults, violations, the counts summed; a figure no run had: "--".
    assert cells == [
        *("``replace``", "redis", "2", "20", "none", "0", "preempted 5"),
        *("0.4 / 0.7 / 0.7", "--"),
    ]
    assert "taken_s: worst p50 / p99 / max" in max_hold and "capped 4" in max_hold
