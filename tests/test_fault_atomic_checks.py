"""The fault suite's atomic-canary checks on small written histories
(tests/faults/atomic_checks.py): committed increments the counter lacks are found, refused and
failed blocks are not writes."""

from __future__ import annotations

from typing import Any

from tests.faults.checker import check


def block(pid: int, token: int, start: float, result: str, value: int = 1) -> dict[str, Any]:
    """How one atomic block ended (tests/faults/atomic_canary.py's ``write`` event)."""
    return {
        "e": "write",
        "t": start + 0.01,
        "pid": pid,
        "key": "k",
        "token": token,
        "kind": "atomic",
        "start": start,
        "end": start + 0.01,
        "accepted": result == "committed",
        "result": result,
        "value": value,
    }


def counter(value: int) -> dict[str, Any]:
    return {"e": "counter", "t": 9.0, "pid": 0, "kind": "atomic", "key": "k", "value": value}


def test_committed_blocks_the_counter_shows_pass_and_are_counted() -> None:
    events = [block(1, 10, 0.0, "committed", 1), block(2, 11, 1.0, "committed", 2), counter(2)]
    report = check(events)
    assert report.ok, report.details
    assert report.atomic == {"committed": 2}
    assert "atomic_canary_lost=0 atomic_committed=2" in report.summary()


def test_a_committed_increment_the_counter_lacks_is_a_violation() -> None:
    # Two holders read 0 and both committed 1: the second overwrote the first.
    events = [block(1, 10, 0.0, "committed", 1), block(2, 11, 1.0, "committed", 1), counter(1)]
    report = check(events)
    assert not report.ok
    assert report.violations["atomic_canary_lost"] == 1
    assert report.as_dict()["atomic_canary_lost"] == 1
    assert "atomic canary 'k' is 1 after 2 committed increments" in report.details


def test_refused_failed_and_unopened_blocks_are_no_writes() -> None:
    events = [
        block(1, 10, 0.0, "committed", 1),
        block(2, 11, 1.0, "refused", 2),  # LockLostError: rolled back
        block(3, 12, 2.0, "failed", 2),  # the server ended an idle block's session
        block(4, 13, 3.0, "rolled_back", 0),  # a delayed round's own block
        {"e": "atomic_refused_entry", "t": 4.0, "pid": 5, "key": "k", "token": 14},
        counter(1),
    ]
    report = check(events)
    assert report.ok, report.details
    assert report.atomic == {
        "committed": 1,
        "refused": 1,
        "failed": 1,
        "rolled_back": 1,
        "refused_entry": 1,
    }


def call(pid: int, sent: float, took: float, key: str = "k") -> dict[str, Any]:
    return {"e": "acall", "t": sent + took, "pid": pid, "key": key, "sent": sent, "took": took}


def test_the_longest_store_acquire_call_is_reported() -> None:
    calls = [call(2, 0.9, took) for took in (0.001, 0.002, 0.75)]
    report = check([block(1, 10, 0.0, "committed"), counter(1), *calls])
    assert report.as_dict()["acquire_call_max_ms"] == 750.0
    assert "acquire_call_ms p50=2.0 p99=750.0 max=750.0 (n=3)" in report.summary()


def test_acquire_calls_during_another_holders_commit_are_told_apart() -> None:
    # pid 1's block wrote and committed from 1.0 to 1.01 (block() gives it 10 ms).
    calls = [
        call(2, 1.005, 0.2),  # during the commit: counted
        call(3, 0.5, 0.6),  # began before it and lasted into it: counted
        call(1, 1.0, 0.3),  # the holder's own
        call(2, 1.02, 0.9),  # after it
        call(2, 1.005, 0.4, key="other"),  # another key
    ]
    report = check([block(1, 10, 1.0, "committed"), counter(1), *calls])
    assert sorted(report.pending_waits) == [0.2, 0.6]
    assert report.as_dict()["pending_wait_max_ms"] == 600.0
    assert "during_commit max=600.0 (n=2)" in report.summary()


def test_calls_of_a_process_stopped_meanwhile_are_left_out() -> None:
    # pid 2 was SIGSTOPped from 1.1 to 6.0 while its acquire call was out: 5.85 s of pause.
    pause = {"e": "fault", "t": 6.0, "pid": 2, "kind": "holder_pause", "start": 1.1, "end": 6.0}
    calls = [call(2, 1.0, 5.85), call(3, 1.005, 0.2), call(2, 6.5, 0.3)]
    report = check([block(1, 10, 1.0, "committed"), counter(1), pause, *calls])
    assert sorted(report.acquire_calls) == [0.2, 0.3]
    assert report.pending_waits == [0.2]


def test_the_atomic_table_sums_both_canaries_and_the_blocks() -> None:
    from tests.faults.table import table

    def result(plain: int, committed: int, p99: float) -> dict[str, Any]:
        return {
            "scenario": "holder_pause",
            "store": "sqlite",
            "operations": 100,
            "faults": {"holder_pause": 2},
            "violations": {"atomic_canary_lost": 0},
            "lost_by": {"deadline": 2},
            "refused_fenced": 1,
            "canary_lost": plain,
            "atomic_canary_lost": 0,
            "atomic": {"committed": committed, "refused": 1},
            "acquire_call_p99_ms": p99,
            "acquire_call_max_ms": p99 * 2,
            "pending_wait_max_ms": p99 / 10,
            "pending_wait_n": 2,
            "lateness_p50_ms": float("nan"),
            "lateness_p99_ms": float("nan"),
            "lateness_max_ms": float("nan"),
            "takeover_p50_s": float("nan"),
            "takeover_p99_s": float("nan"),
        }

    text = table([result(3, 40, 10.0), result(2, 50, 30.0)], atomic=True)
    cells = text.split("   * - ``holder_pause``")[1].split("\n     - ")[1:]
    assert cells == [
        "sqlite",
        "2",
        "200",
        "holder_pause 4",
        "0",
        "deadline 4",
        "5",
        "0",
        "90 / 2 / 0 / 0",
        "30 / 60",
        "4, 3",
    ]
