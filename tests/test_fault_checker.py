"""The fault suite's checker on small written histories: a clean one passes, and each kind of
violation planted once is found once (tests/faults/checker.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.faults.checker import VIOLATIONS, check

TTL = 2.0


def held(pid: int, token: int, start: float, end: float, key: str = "k") -> list[dict[str, Any]]:
    """A holder that acquired at ``start``, wrote under its claim and released at ``end``."""
    return [
        {"e": "invoke", "t": start - 0.01, "pid": pid, "key": key},
        {
            "e": "ok",
            "t": start,
            "pid": pid,
            "key": key,
            "token": token,
            "owner": f"o{token}",
            "deadline": start + TTL * 0.99 - 0.005,
        },
        write(pid, token, "claim", start + 0.01, key=key),
        write(pid, token, "fenced", end - 0.02, key=key, value=token),
        write(pid, token, "canary", end - 0.01, key=key, value=token),
        {
            "e": "release",
            "t": end,
            "pid": pid,
            "key": key,
            "token": token,
            "deadline": start + TTL * 0.99 - 0.005,
        },
    ]


def write(
    pid: int,
    token: int,
    kind: str,
    start: float,
    *,
    key: str = "k",
    accepted: bool = True,
    value: int = 0,
) -> dict[str, Any]:
    return {
        "e": "write",
        "t": start + 0.005,
        "pid": pid,
        "key": key,
        "token": token,
        "kind": kind,
        "start": start,
        "end": start + 0.005,
        "accepted": accepted,
        "value": value,
    }


def counters(fenced: int, canary: int, key: str = "k") -> list[dict[str, Any]]:
    return [
        {"e": "counter", "t": 100.0, "pid": 0, "kind": "fenced", "key": key, "value": fenced},
        {"e": "counter", "t": 100.0, "pid": 0, "kind": "canary", "key": key, "value": canary},
    ]


def clean() -> list[dict[str, Any]]:
    return [
        *held(1, 10, 0.0, 1.0),
        *held(2, 11, 1.1, 2.0),
        *held(1, 12, 2.5, 3.0),
        *counters(3, 3),
    ]


def only(report: Any, name: str) -> None:
    found = {v: report.violations[v] for v in VIOLATIONS if report.violations[v]}
    assert found == {name: 1}, (found, report.details)


def test_a_clean_history_has_no_violation() -> None:
    report = check(clean())
    assert report.ok, report.details
    assert report.acquisitions == 3
    assert report.canary_lost == 0
    assert "OK ops=" in report.summary()


def test_overlapping_validity_windows() -> None:
    # Token 11 starts while token 10 is still valid (0.0 .. 1.0); 10 wrote before 11 claimed.
    first = [e for e in held(1, 10, 0.0, 1.0) if e["e"] != "write" or e["kind"] == "claim"]
    first += [write(1, 10, "fenced", 0.5, value=1), write(1, 10, "canary", 0.51, value=1)]
    events = [*first, *held(2, 11, 0.9, 1.5), *counters(2, 2)]
    only(check(events), "overlap")


def test_a_window_ends_at_the_deadline_even_when_the_holder_releases_later() -> None:
    # A paused holder releases at 5.0, but its deadline (1.975) passed long before: no overlap.
    events = [*held(1, 10, 0.0, 5.0), *held(2, 11, 2.1, 3.0), *counters(1, 2)]
    events = [
        e for e in events if not (e["e"] == "write" and e["pid"] == 1 and e["kind"] != "claim")
    ]
    report = check(events)
    assert report.ok, report.details


def test_the_late_ok_does_not_count() -> None:
    # The acquire's answer arrived after its own deadline: an empty window, no overlap with 11.
    events = held(2, 11, 0.5, 1.5)
    late = [
        {"e": "ok", "t": 2.3, "pid": 1, "key": "k", "token": 10, "owner": "o10", "deadline": 1.9},
        {
            "e": "lost",
            "t": 2.3,
            "pid": 1,
            "key": "k",
            "token": 10,
            "by": "deadline",
            "deadline": 1.9,
        },
        {"e": "release", "t": 2.31, "pid": 1, "key": "k", "token": 10, "deadline": 1.9},
    ]
    report = check([*events, *late, *counters(1, 1)])
    assert report.ok, report.details
    assert report.late_oks == 1
    assert report.lateness == []  # the late reply is not the engine's lateness


def test_tokens_must_grow_in_acquisition_order() -> None:
    events = [*held(1, 12, 0.0, 1.0), *held(2, 11, 1.1, 2.0), *counters(1, 2)]
    report = check(events)
    # Token 11's write after 12 finished is also stale; the planted kind is token order.
    assert report.violations["token_order"] == 1, report.details
    assert report.violations["overlap"] == 0


def test_a_token_handed_to_two_owners() -> None:
    first, second = held(1, 10, 0.0, 1.0), held(2, 10, 1.1, 2.0)
    second[1]["owner"] = "someone else"
    events = [*first, *second, *counters(2, 2)]
    report = check(events)
    assert report.violations["duplicate_token"] == 1, report.details
    assert report.violations["overlap"] == 0


def test_a_stale_fenced_write_accepted() -> None:
    # Holder 10, paused, writes at 1.5 after token 11 claimed the row at 1.11: accepted = stale.
    events = [*held(1, 10, 0.0, 0.5), *held(2, 11, 1.1, 2.0), *counters(3, 3)]
    events.append(write(1, 10, "fenced", 1.5, value=1))
    only(check(events), "stale_write")


def test_a_refused_stale_write_is_no_violation() -> None:
    events = [*held(1, 10, 0.0, 0.5), *held(2, 11, 1.1, 2.0), *counters(2, 2)]
    events.append(write(1, 10, "fenced", 1.5, accepted=False))
    report = check(events)
    assert report.ok, report.details
    assert report.refused_fenced == 1


def test_fenced_lost_updates() -> None:
    events = [*held(1, 10, 0.0, 1.0), *held(2, 11, 1.1, 2.0), *counters(1, 2)]
    only(check(events), "fenced_lost")


def test_the_canary_counts_its_lost_updates_without_failing() -> None:
    events = [*held(1, 10, 0.0, 1.0), *held(2, 11, 1.1, 2.0), *counters(2, 1)]
    report = check(events)
    assert report.ok
    assert report.canary_lost == 1
    assert "canary_lost_updates=1" in report.summary()


def test_lateness_and_takeover_figures() -> None:
    events = [
        *held(1, 10, 0.0, 1.0),
        {"e": "ok", "t": 1.1, "pid": 2, "key": "k", "token": 11, "owner": "b", "deadline": 3.0},
        {
            "e": "lost",
            "t": 3.004,
            "pid": 2,
            "key": "k",
            "token": 11,
            "by": "deadline",
            "deadline": 3.0,
        },
        {"e": "release", "t": 3.01, "pid": 2, "key": "k", "token": 11, "deadline": 3.0},
        # A holder paused across its deadline: that loss is left out of the lateness.
        {"e": "ok", "t": 4.0, "pid": 3, "key": "k", "token": 12, "owner": "c", "deadline": 5.9},
        {"e": "fault", "t": 9.0, "pid": 3, "kind": "holder_pause", "start": 5.0, "end": 9.0},
        {
            "e": "lost",
            "t": 9.0,
            "pid": 3,
            "key": "k",
            "token": 12,
            "by": "deadline",
            "deadline": 5.9,
        },
        {"e": "release", "t": 9.01, "pid": 3, "key": "k", "token": 12, "deadline": 5.9},
        # A holder killed at 10.0 (its pid 4 is the fault's, so the fault event carries it).
        {"e": "ok", "t": 9.5, "pid": 4, "key": "k", "token": 13, "owner": "d", "deadline": 11.4},
        {
            "e": "fault",
            "t": 10.0,
            "pid": 4,
            "kind": "holder_kill",
            "key": "k",
            "start": 10.0,
            "end": 10.0,
        },
        {"e": "ok", "t": 11.5, "pid": 5, "key": "k", "token": 14, "owner": "e", "deadline": 13.4},
        *counters(1, 1),
    ]
    report = check(events)
    assert report.ok, report.details
    assert report.lateness == [pytest.approx(0.004)]
    assert report.takeover == [pytest.approx(1.5)]
    figures = report.figures()
    assert figures["lateness_p99_ms"] == 4.0
    assert figures["takeover_p50_s"] == 1.5
    assert math.isnan(check(clean()).figures()["lateness_p50_ms"])


def test_leader_terms_from_their_writes() -> None:
    leader = [
        write(1, 10, "leader", 0.0),
        write(1, 10, "leader", 0.35),
        write(2, 11, "leader", 0.2),  # the new leader wrote twice while the old one still did
        write(2, 11, "leader", 0.3),
    ]
    for event in leader:
        event["key"] = "lead"
    report = check(leader)
    assert report.violations["overlap"] == 1, report.details
    assert report.violations["stale_write"] == 1  # the old one's last write, after the new's


def test_a_leader_stopped_in_the_middle_of_its_last_write_does_not_overlap_its_successor() -> None:
    old = [write(1, 10, "leader", 0.0), write(1, 10, "leader", 0.1)]
    old[1]["end"] = 2.0  # SIGSTOPped mid-write: the end is stamped when it runs again
    new = [write(2, 11, "leader", 1.0), write(2, 11, "leader", 1.5)]
    for event in old + new:
        event["key"] = "lead"
    report = check(old + new)
    assert report.ok, report.details


def test_the_docs_table_sums_the_runs_and_keeps_the_worst_figures() -> None:
    from tests.faults.table import table

    def result(ops: int, p99: float, overlap: int) -> dict[str, object]:
        return {
            "scenario": "hung_connection",
            "store": "redis",
            "operations": ops,
            "faults": {"hung_connection": 2},
            "violations": {"overlap": overlap, "stale_write": 0},
            "lost_by": {"deadline": 1},
            "refused_fenced": 0,
            "canary_lost": 1,
            "lateness_p50_ms": 1.0,
            "lateness_p99_ms": p99,
            "lateness_max_ms": p99,
            "takeover_p50_s": math.nan,
            "takeover_p99_s": math.nan,
        }

    rows = table([result(100, 4.5, 0), result(50, 6.5, 1)]).split("\n   * - ")[2].split("\n")
    cells = [cell.strip().removeprefix("- ") for cell in rows]
    assert cells[:9] == [
        "``hung_connection``",
        "redis",
        "2",
        "150",
        "hung_connection 4",
        "1 (overlap 1)",
        "deadline 2",
        "0",
        "2",
    ]
    assert cells[9:] == ["1 / 6.5 / 6.5", "--"]


# Permits (the permits scenario): each ok names its permit, writes go to the permit's own row.


def permit_held(
    pid: int, token: int, permit: int, start: float, end: float, permits: int = 3
) -> list[dict[str, Any]]:
    """A holder of permit ``permit`` of ``k`` (permits=``permits``), writing to ``k#<permit>``."""
    events = held(pid, token, start, end)
    for event in events:
        if event["e"] == "ok":
            event |= {"permit": permit, "permits": permits}
        elif event["e"] == "write":
            event["key"] = f"k#{permit}"
    return events


def slot_counters(*values: int) -> list[dict[str, Any]]:
    """The fenced and canary counters of slots 1, 2, ... at ``values``."""
    return [e for n, v in enumerate(values, 1) for e in counters(v, v, key=f"k#{n}")]


def three_at_once() -> list[dict[str, Any]]:
    """Three holders of three permits at once, then each slot handed on, one ending at the
    instant the next starts."""
    return [
        *permit_held(1, 10, 1, 0.0, 1.0),
        *permit_held(2, 11, 2, 0.1, 1.5),
        *permit_held(3, 12, 3, 0.2, 1.2),
        *permit_held(4, 14, 1, 1.0, 1.9),
        *permit_held(5, 15, 3, 1.3, 1.8),
        *permit_held(6, 16, 2, 1.6, 1.9),
    ]


def no_writes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["e"] != "write"]


def test_three_holders_of_three_permits_is_no_violation() -> None:
    report = check([*three_at_once(), *slot_counters(2, 2, 2)])
    assert report.ok, report.details
    assert report.acquisitions == 6
    assert report.peak_holders == 3
    assert report.summary().endswith("| peak_holders=3")
    assert "peak_holders" not in check(clean()).summary()


def test_a_fourth_valid_holder_of_three_permits() -> None:
    # Token 13 is handed permit 3 at 0.5 while 10, 11 and 12 are all still valid.
    events = [
        *three_at_once(),
        *no_writes(permit_held(7, 13, 3, 0.5, 0.9)),
        *slot_counters(2, 2, 2),
    ]
    report = check(events)
    found = {v: report.violations[v] for v in VIOLATIONS if report.violations[v]}
    # Four holders of three slots share one: that slot's windows overlap too.
    assert found == {"over_permits": 1, "overlap": 1}, report.details
    assert any("4 holders of 'k' (permits=3) at 0.500" in line for line in report.details)


def test_a_fourth_holder_naming_a_fourth_permit() -> None:
    # No slot is shared, yet four were valid at once, one of them a permit the key does not have.
    events = [*three_at_once(), *permit_held(7, 13, 4, 0.5, 0.9), *slot_counters(2, 2, 2, 1)]
    report = check(events)
    assert report.violations["over_permits"] == 2, report.details  # the moment and the permit
    assert report.violations["overlap"] == 0


def test_a_holder_paused_past_its_deadline_is_no_fourth_holder() -> None:
    # Holder 10 releases at 5.0, but its deadline (1.975) ended its validity: slot 1 then went to
    # 13 at 2.0 while 11 and 12 held the others.
    events = [
        *[e for e in permit_held(1, 10, 1, 0.0, 5.0) if e["e"] != "write" or e["kind"] == "claim"],
        *permit_held(2, 11, 2, 1.0, 3.0),
        *permit_held(3, 12, 3, 1.5, 3.5),
        *permit_held(4, 13, 1, 2.0, 3.0),
        *slot_counters(1, 1, 1),
    ]
    report = check(events)
    assert report.ok, report.details


def test_a_token_of_one_slot_handed_out_again_on_another() -> None:
    events = [*permit_held(1, 10, 1, 0.0, 1.0), *permit_held(2, 10, 2, 0.1, 1.1)]
    events[1]["owner"] = "another owner"
    only(check([*events, *slot_counters(1, 1)]), "duplicate_token")


def test_a_stale_fenced_write_to_a_permits_own_row() -> None:
    # Token 10 of slot 1, paused, writes its row at 1.5 after token 12 took slot 1 and claimed it.
    events = [
        *permit_held(1, 10, 1, 0.0, 0.5),
        *permit_held(2, 11, 2, 0.2, 2.0),
        *permit_held(3, 12, 1, 1.1, 2.0),
        *slot_counters(3, 1),
    ]
    late = write(1, 10, "fenced", 1.5, value=1)
    late["key"] = "k#1"
    only(check([*events, late]), "stale_write")


def test_tokens_order_each_permit_only() -> None:
    # Slot 2's token 11 writes its row after slot 1's token 12 finished: other rows, no stale
    # write; tokens need not grow across slots in window order.
    events = [
        *permit_held(1, 12, 1, 0.0, 0.5),
        *permit_held(2, 11, 2, 0.1, 1.0),
        *slot_counters(1, 1),
    ]
    assert check(events).ok
    # On one slot they must.
    events = [*permit_held(1, 12, 1, 0.0, 0.5), *permit_held(2, 11, 1, 0.6, 1.0), *slot_counters(2)]
    assert check(events).violations["token_order"] == 1


def test_fenced_lost_updates_per_permit() -> None:
    events = [*permit_held(1, 10, 1, 0.0, 1.0), *permit_held(2, 11, 2, 0.1, 1.1)]
    only(check([*events, *slot_counters(1, 0)]), "fenced_lost")


def test_a_killed_permit_holders_takeover_is_its_own_slots() -> None:
    events = [
        *permit_held(1, 10, 1, 0.0, 1.0),
        *[e for e in permit_held(2, 11, 2, 0.1, 9.0) if e["e"] in ("invoke", "ok")],
        {
            "e": "fault",
            "t": 0.5,
            "pid": 2,
            "kind": "holder_kill",
            "key": "k",
            "token": 11,
            "start": 0.5,
            "end": 0.5,
        },
        *permit_held(3, 12, 1, 1.2, 2.0),  # slot 1, free sooner: not the takeover
        *permit_held(4, 13, 2, 2.6, 3.0),
        *slot_counters(2, 1),
    ]
    report = check(events)
    assert report.ok, report.details
    assert report.takeover == [pytest.approx(2.1)]
