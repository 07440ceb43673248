"""The judge of tests/test_celery_missed_ticks.py (tests/beat_ticks.py) on made-up runs and logs:
it passes what beat must do, and fails a tick published twice or missed without a report."""

from __future__ import annotations

import datetime
from typing import Any

from tests.beat_ticks import Kill, Ticks, judge

HOLDER, STANDBY = "vm:1", "vm:2"
BASE = 1_800_000_000.0  # a multiple of the period
ALIGNED = Ticks(2.0, aligned=True)


def iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat()


def hms(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%H:%M:%S UTC")


def line(t: float, text: str, level: str = "WARNING") -> str:
    moment = datetime.datetime.fromtimestamp(t, datetime.UTC)
    return (
        f"[{moment:%Y-%m-%d %H:%M:%S},{moment.microsecond // 1000:03d}: {level}/MainProcess] {text}"
    )


def run(t: float, beat: str, catch_up: str | None = None) -> dict[str, Any]:
    return {"task": "job", "scheduled": iso(t), "beat": beat, "catch_up": catch_up, "at": t + 0.02}


def standby_log(*skips: float, took: float, warning: str = "") -> tuple[str, int]:
    """A standby's log: its skips, the kill (the offset returned), the takeover, ``warning``."""
    before = "".join(
        line(t, "Skipped job (key 'job:owner'): it runs on another instance", "DEBUG") + "\n"
        for t in skips
    )
    after = line(took, "job runs on this instance (lease 'job:owner', fencing token 7)", "INFO")
    return before + after + "\n" + (line(took, warning) + "\n" if warning else ""), len(before)


def missed_line(due: float, *, caught_up: bool) -> str:
    outcome = (
        f"the latest, due {hms(due)}, is published now, late (catch_up=True)" if caught_up else "x"
    )
    return (
        f"Beat entry 'job' (task 'job'): 1 tick due {hms(due)} was missed (later than the last "
        f"tick recorded): the beat that held 'job:owner' (vm pid 1) stopped renewing after "
        f"recording an earlier tick; {outcome}."
    )


def before_kill(runs: list[dict[str, Any]], warning: str) -> Kill:
    log, since = standby_log(
        BASE + 0.01, BASE + 2.01, BASE + 4.01, took=BASE + 5.5, warning=warning
    )
    return Kill("before", HOLDER, STANDBY, BASE + 3.7, due=BASE + 4, log=log, since=since)


def test_a_missed_tick_caught_up_once_passes() -> None:
    runs = [run(BASE, HOLDER), run(BASE + 2, HOLDER), run(BASE + 4.01, STANDBY, "1")]
    runs.append(run(BASE + 6, STANDBY))
    verdict = judge(
        before_kill(runs, missed_line(BASE + 4.01, caught_up=True)), "job", True, runs, ALIGNED
    )
    assert verdict.problems == []
    assert (verdict.caught_up, verdict.missed, verdict.duplicates) == (1, 0, 0)
    assert verdict.takeover is not None and abs(verdict.takeover - 1.8) < 1e-6


def test_a_tick_published_twice_fails() -> None:
    runs = [run(BASE, HOLDER), run(BASE + 2, HOLDER), run(BASE + 4.01, STANDBY, "1")]
    runs += [run(BASE + 4.5, STANDBY), run(BASE + 6, STANDBY)]
    verdict = judge(
        before_kill(runs, missed_line(BASE + 4.01, caught_up=True)), "job", True, runs, ALIGNED
    )
    assert verdict.duplicates == 1
    assert any("published twice" in problem for problem in verdict.problems)


def test_a_missed_tick_nobody_reports_fails() -> None:
    runs = [run(BASE, HOLDER), run(BASE + 2, HOLDER), run(BASE + 6, STANDBY)]
    verdict = judge(before_kill(runs, ""), "job", False, runs, ALIGNED)
    assert (verdict.missed, verdict.unreported) == (1, 1)
    assert any("not published, not reported" in problem for problem in verdict.problems)
    assert any("no run_skipped code 'missed'" in problem for problem in verdict.problems)


def test_a_reported_missed_tick_passes_without_catch_up() -> None:
    runs = [run(BASE, HOLDER), run(BASE + 2, HOLDER), run(BASE + 6, STANDBY)]
    kill = before_kill(runs, missed_line(BASE + 4.01, caught_up=False))
    kill.log += line(BASE + 5.5, "hooks: run_skipped key='job:owner' code='missed'", "INFO")
    verdict = judge(kill, "job", False, runs, ALIGNED)
    assert verdict.problems == []
    assert (verdict.missed, verdict.unreported) == (1, 0)


def test_the_last_tick_published_again_after_a_kill_fails() -> None:
    runs = [
        run(BASE, HOLDER),
        run(BASE + 2, HOLDER),
        run(BASE + 2.3, STANDBY),
        run(BASE + 4, STANDBY),
    ]
    log, since = standby_log(BASE + 0.01, BASE + 2.01, took=BASE + 2.2)
    kill = Kill(
        "after", HOLDER, STANDBY, BASE + 2.05, said={"scheduled": {"job:owner": iso(BASE + 2)}}
    )
    kill.log, kill.since = log, since
    verdict = judge(kill, "job", True, runs, ALIGNED)
    assert any("published the holder's last tick" in problem for problem in verdict.problems)


def test_unaligned_ticks_are_told_apart_by_half_a_period() -> None:
    ticks = Ticks(2.0, aligned=False)
    assert ticks.same(BASE, BASE + 0.9) and not ticks.same(BASE, BASE + 1.1)
    assert ticks.holes([BASE, BASE + 2.9, BASE + 7.1]) == [(BASE + 2.9, BASE + 7.1, 1)]
