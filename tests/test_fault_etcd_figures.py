"""The fault suite's etcd figures on small written histories: a takeover after a crash against
P5's bound on etcd ("the effective ttl, plus the election timeout when the leader changed",
tests/faults/figures.py), and the etcd table (tests/faults/table.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.faults.checker import check
from tests.faults.harness import RunConfig, stores_of
from tests.test_fault_checker import counters, held

TTL = 3.0


def cluster() -> dict[str, Any]:
    return {"e": "cluster", "t": 0.0, "pid": 0, "ttl": TTL, "election_s": 1.0}


def killed(pid: int, token: int, at: float) -> list[dict[str, Any]]:
    """A holder of ``k`` from ``at - 1`` SIGKILLed at ``at``."""
    return [
        {
            "e": "ok",
            "t": at - 1,
            "pid": pid,
            "key": "k",
            "token": token,
            "owner": f"o{token}",
            "deadline": at - 1 + TTL * 0.99,
        },
        {
            "e": "fault",
            "t": at,
            "pid": pid,
            "kind": "holder_kill",
            "key": "k",
            "token": token,
            "start": at,
            "end": at,
        },
    ]


def test_a_takeover_within_the_effective_ttl_after_a_crash() -> None:
    events = [cluster(), *killed(1, 10, 10.0), *held(2, 11, 12.5, 13.0), *counters(1, 1)]
    report = check(events)
    assert report.ok, report.details
    assert report.takeover == [pytest.approx(2.5)]
    assert report.p5_excess == [pytest.approx(-0.5)]
    assert "p5_excess_max_s=-0.5" in report.summary()


def refused(pid: int, sent: float) -> dict[str, Any]:
    return {
        "e": "acall",
        "t": sent + 0.01,
        "pid": pid,
        "key": "k",
        "sent": sent,
        "took": 0.01,
        "granted": False,
    }


def test_a_takeover_later_than_the_ttl_is_over_the_bound() -> None:
    events = [cluster(), *killed(1, 10, 10.0), *held(2, 11, 13.4, 14.0), *counters(1, 1)]
    report = check(events)
    assert report.p5_excess == [pytest.approx(0.4)]
    assert report.p5_held == []  # nobody tried in between: the key may have been free at 13


def test_a_refused_acquire_after_the_bound_proves_the_key_outlived_it() -> None:
    tries = [refused(2, 12.5), refused(2, 13.2), refused(3, 20.0)]  # the last after the takeover
    events = [cluster(), *killed(1, 10, 10.0), *tries, *held(2, 11, 13.4, 14.0), *counters(1, 1)]
    report = check(events)
    assert report.p5_held == [pytest.approx(0.2)]
    assert "p5_held_max_s=0.2" in report.summary()
    # Refused only before the bound: held at least until 12.5, within it.
    report = check([e for e in events if e.get("sent") != 13.2])
    assert report.p5_held == [pytest.approx(-0.5)]


def test_after_a_leader_change_the_bound_counts_from_the_election() -> None:
    # The leader killed with the holder; a new one elected 1.5 s later restarts every lease at
    # its TTL plus an election timeout: the key may stay until 10 + 1.5 + 1 + 3 = 15.5.
    change = {"e": "fault", "t": 14.0, "pid": None, "kind": "etcd_leader_kill", "start": 10.0,
              "end": 14.0, "elected": 11.5}  # fmt: skip
    events = [cluster(), change, *killed(1, 10, 10.0), *held(2, 11, 15.0, 16.0), *counters(1, 1)]
    report = check(events)
    assert report.ok, report.details
    assert report.takeover == [pytest.approx(5.0)]
    assert report.p5_excess == [pytest.approx(-0.5)]
    # An election after the takeover does not count.
    change["elected"] = 15.2
    assert check(events).p5_excess == [pytest.approx(2.0)]


def test_the_longest_gap_between_a_keys_holders() -> None:
    events = [*held(1, 10, 0.0, 1.0), *held(2, 11, 1.2, 2.0), *held(3, 12, 9.0, 9.5)]
    events += held(4, 13, 0.5, 0.9, key="other")
    report = check([*events, *counters(3, 3), *counters(1, 1, key="other")])
    assert report.ok, report.details
    assert report.gap_max == pytest.approx(7.0)
    assert "gap_max_s=7.0" in report.summary()


def test_no_p5_figure_off_etcd() -> None:
    events = [*killed(1, 10, 10.0), *held(2, 11, 13.4, 14.0), *counters(1, 1)]
    report = check(events)
    assert report.takeover and not report.p5_excess
    assert math.isnan(report.figures()["p5_excess_max_s"])
    assert "p5_excess" not in report.summary()


def test_the_etcd_table_names_each_violation_the_issue_asks_about() -> None:
    from tests.faults.table import table

    def result(overlap: int, decreasing: int, excess: float, held: float) -> dict[str, Any]:
        return {
            "scenario": "etcd_leader_kill",
            "store": "etcd",
            "operations": 100,
            "faults": {"etcd_leader_kill": 3, "holder_kill": 1},
            "violations": {"overlap": overlap, "token_order": decreasing, "fenced_lost": 1},
            "lost_by": {"deadline": 2},
            "refused_fenced": 1,
            "canary_lost": 0,
            "lateness_p50_ms": 2.0,
            "lateness_p99_ms": 7.5,
            "lateness_max_ms": 7.5,
            "takeover_p50_s": 4.0,
            "takeover_p99_s": 5.0,
            "takeover_max_s": 5.0,
            "p5_excess_max_s": excess,
            "gap_max_s": 4.5,
            "p5_held_max_s": held,
        }

    postgres = result(0, 0, math.nan, math.nan) | {"store": "postgres"}
    text = table([result(1, 0, -0.4, -0.3), result(0, 2, -0.1, -0.6), postgres], etcd=True)
    rows = text.split("\n   * - ")
    assert len(rows) == 3  # the header and the one etcd row: no other store's
    cells = [cell.strip().removeprefix("- ") for cell in rows[2].split("\n")]
    assert cells == [
        "``etcd_leader_kill``",
        "2",
        "200",
        "etcd_leader_kill 6, holder_kill 2",
        "1",
        "0 / 2",
        "0",
        "2",
        "deadline 4",
        "2",
        "2 / 7.5 / 7.5",
        "4 / 5 / 5",
        "-0.1 (-0.3)",
        "4.5",
    ]


def test_the_etcd_scenarios_run_on_etcd_and_its_ttl_is_3s() -> None:
    for name in (
        "etcd_leader_kill",
        "etcd_member_pause",
        "etcd_hung_route",
        "etcd_cluster_restart",
    ):
        assert stores_of(name) == ("etcd",)
    assert "etcd" in stores_of("holder_kill") and "etcd" not in stores_of("hung_connection")
    assert stores_of("atomic_pgbouncer") == ("postgres",)
    assert stores_of("store_restart_everysec") == ("redis",)
    assert RunConfig("baseline", "etcd").ttl == 3.0
    assert RunConfig("baseline", "redis").ttl == 2.0
    assert RunConfig("etcd_hung_route", "etcd").cs_max == 9.0
    assert RunConfig("baseline", "postgres").cs_max == 2.0
    with pytest.raises(ValueError, match="runs on etcd only"):
        RunConfig("etcd_member_pause", "redis")
