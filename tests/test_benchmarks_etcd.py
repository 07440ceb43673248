"""The etcd benchmark works: ``python -m benchmarks --etcd --quick`` runs end to end on a cluster
of its own (tests/servers/etcd.py, started by the benchmark).

Only counts are asserted (requests sent and received, handoffs classed), never a time, as in
tests/test_benchmarks.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_runs import quick_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.etcd]


def test_quick_etcd_run_counts_the_renewals_and_classes_the_handoffs(tmp_path: Path) -> None:
    figures = tmp_path / "etcd.json"
    run = quick_benchmark("--etcd", figures=figures)
    out = run.stdout
    for heading in (
        "== etcd: a three-member cluster on loopback",
        "Uncontended acquire + release",
        "floor: 2 raw Txns (etcd3gw)",
        "Renewal: 1,000 locks held by one process",
        "Handoff: 8 waiting processes, each its own store and watch",
        "Handoff: 8 waiting threads of one process",
        "== Against the goals of issue 28 ==",
    ):
        assert heading in out, heading
    results = json.loads(figures.read_text())
    pairs = results["latency"]["pairs"]
    assert set(pairs) == {
        "floor: 2 raw Txns (etcd3gw)",
        "django_locks",
        "its store calls alone",
        "the store's requests, posted raw",
        "the same, on a key the watch sees",
    }
    for name, pair in pairs.items():
        assert pair["samples"] == 2 * 10, name  # --quick: 2 rounds of 10
        assert pair["ratio"] > 0, name
    # Counted at the store's wire: a pair is two Txns (and the acquire's keepalive, if any).
    for name in ("django_locks", "its store calls alone"):
        sent = pairs[name]["requests"]
        assert sent.count("kv/txn") == 2 and set(sent) <= {"kv/txn", "lease/keepalive"}, sent
    # Counted, not timed: one heartbeat Txn and one keepalive per period for the 1,000 locks,
    # as the store sent them and as the members received them; none lost.
    renewal = results["renewal"]
    periods = renewal["periods"]
    rounds = renewal["renew_many_calls"]
    assert rounds in (periods - 1, periods)  # one round a period started in the window
    assert renewal["round_trips_per_renew_many"] == {"2": rounds}  # each: a Txn, a keepalive
    assert set(renewal["requests"]) == {"kv/txn", "lease/keepalive"}
    assert renewal["round_trips_per_period"] <= 2
    assert set(renewal["at_cluster"]) <= {"Txn", "LeaseKeepAlive"}
    assert 1 <= renewal["at_cluster"].get("LeaseKeepAlive", 0) <= periods
    assert renewal["at_cluster_per_period"] <= 2
    assert renewal["leases_renewed_per_period"] * periods == 1000 * rounds
    assert renewal["watch_streams_opened"] == 0
    assert renewal["lost"] == 0
    # Every handoff is classed, and the waiters' watches delivered deletions (a recorder that
    # saw no wait would class every handoff "no pause").
    for mode in ("processes", "threads"):
        handoff = results["handoff"][mode]
        assert handoff["handoffs"] == 6, mode
        assert sum(handoff["woken"].values()) == 6, mode
        assert handoff["woken"]["error"] == 0, mode
        assert handoff["woken"]["notice"] >= 1, mode
        assert handoff["waits"]["notice"] >= handoff["woken"]["notice"], mode
        assert handoff["woken_after"]["samples"] == handoff["woken"]["notice"], mode
        assert handoff["release_call"]["samples"] >= 6, mode
    assert [goal["goal"].split(":")[0] for goal in results["goals"]] == [
        "acquire+release <= 1.2x two raw Txns",
        "1,000 held locks",
        "handoff, 8 processes",
    ]
