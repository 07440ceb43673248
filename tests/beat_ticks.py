"""What a run of tests/test_celery_missed_ticks.py saw: the ticks the worker ran, what the
standby beat logged, and the verdict of each kill (stdlib only: the test and its figures).

A tick is the instant beat published it (``django_locks_scheduled``). With an aligned schedule
(tests/celeryapp/schedules.py) every beat is due at the same wall-clock multiples of the period,
so a tick is an integer, ``floor(scheduled / period)``. Without one (django-celery-beat's
IntervalSchedule: each beat's ticks fall where its own last run was) two beats' ticks of one
period differ by up to a period, and ticks are told apart the way beat does it, with half the
period as the tolerance: two publications closer than that are one tick published twice, a gap
longer than one and a half periods holds a missed one.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import re
import statistics
from typing import Any

MISSED = re.compile(
    r"Beat entry '(?P<entry>[^']+)' \(task '[^']+'\): \d+ ticks? due (?P<due>.+?) "
    r"(?:was missed|were missed|may not have been published) \([^)]*\): .*?; "
    r"(?P<outcome>[^;]*)\.$"
)
MAYBE = re.compile(
    r"Beat entry '(?P<entry>[^']+)' \(task '[^']+'\): its tick due .* was recorded, maybe not "
    r"published: .* Look for a run with django_locks_scheduled (?P<iso>\S+) \("
)
WHEN = re.compile(r"(\d\d):(\d\d):(\d\d) UTC")
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): ")


def scheduled(run: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(run["scheduled"]).timestamp()


def stamp(line: str) -> float | None:
    """The time of a Celery log line (``[2026-12-02 05:40:02,123: WARNING/MainProcess] ...``,
    UTC), None for a line without one."""
    found = STAMP.match(line)
    if found is None:
        return None
    moment = datetime.datetime.fromisoformat(found.group(1)).replace(tzinfo=datetime.UTC)
    return moment.timestamp() + int(found.group(2)) / 1000


def clock_time(text: str, near: float) -> float:
    """``HH:MM:SS`` (UTC) of a log line written at ``near``, as an instant (the latest one not
    after ``near`` plus a second)."""
    hours, minutes, seconds = map(int, WHEN.search(text).groups())  # type: ignore[union-attr]
    day = datetime.datetime.fromtimestamp(near, datetime.UTC).replace(
        hour=hours, minute=minutes, second=seconds, microsecond=0
    )
    moment = day.timestamp()
    return moment - 86400 if moment > near + 1 else moment


@dataclasses.dataclass
class Reports:
    """What a standby's log said of one entry after a kill. A WARNING names ticks by their
    ``HH:MM:SS``; each is resolved to the standby's own skip of that second (its ``Skipped ...:
    it runs on another instance`` line, to the millisecond)."""

    missed: list[float] = dataclasses.field(default_factory=list)
    published: list[float] = dataclasses.field(default_factory=list)  # caught up, "now"
    maybe: list[str] = dataclasses.field(default_factory=list)  # ISO 8601 of the record's tick
    codes: list[str] = dataclasses.field(default_factory=list)  # run_skipped codes (the hook)
    took: float | None = None  # when it took the entry's owner lease
    skips: list[float] = dataclasses.field(default_factory=list)  # it runs on another instance
    lines: list[str] = dataclasses.field(default_factory=list)


def reports(log: str, since: int, entry: str, key: str) -> Reports:
    """Parse a standby's log for ``entry`` (its task of the same name): its skips from the start,
    what it said from offset ``since`` (the kill) on."""
    found = Reports()
    skips = found.skips
    skipped = f"Skipped {entry} (key {key!r}): it runs on another instance"

    def resolve(text: str, near: float) -> float:
        second = clock_time(text, near)
        # The line comes a few milliseconds after the instant the WARNING names.
        exact = [t for t in skips if second <= t < second + 1.05]
        return exact[-1] if exact else second + 0.5

    for offset, line in _lines(log):
        near = stamp(line)
        if near is None:
            continue
        if skipped in line:
            skips.append(near)
        if offset < since:
            continue
        missed = MISSED.search(line)
        if missed is not None and missed.group("entry") == entry:
            found.lines.append(line)
            due = missed.group("due")
            found.missed += [resolve(m.group(0), near) for m in WHEN.finditer(due)]
            outcome = missed.group("outcome")
            if "is published now" in outcome:
                found.published.append(resolve(outcome, near))
        maybe = MAYBE.search(line)
        if maybe is not None and maybe.group("entry") == entry:
            found.lines.append(line)
            found.maybe.append(maybe.group("iso"))
        if f"hooks: run_skipped key={key!r} " in line:
            found.codes += re.findall(r"code='([^']*)'", line)
            if "code='elsewhere'" not in line:
                found.lines.append(line)
        if found.took is None and f"{entry} runs on this instance (lease {key!r}" in line:
            found.lines.append(line)
            found.took = near
    return found


def _lines(text: str) -> list[tuple[int, str]]:
    out, offset = [], 0
    for line in text.splitlines(keepends=True):
        out.append((offset, line.rstrip("\n")))
        offset += len(line)
    return out


@dataclasses.dataclass
class Kill:
    """One SIGKILL of the holder beat, and what followed."""

    scenario: str  # "before" (0.3 s before a tick), "after" (publishing), "record"
    holder: str  # "host:pid" (the beat header)
    standby: str
    at: float  # when it was killed
    due: float | None = None  # "before": the tick it was killed before
    said: dict[str, Any] | None = None  # what the kill hook wrote ("after", "record")
    log: str = ""  # the standby's log, up to the end of the run
    since: int = 0  # where the kill falls in it


@dataclasses.dataclass
class Verdict:
    """One entry's outcome of one kill."""

    scenario: str
    task: str
    catch_up: bool
    problems: list[str] = dataclasses.field(default_factory=list)
    late: bool = False  # "before": the holder published the tick before the kill landed
    caught_up: int = 0  # ticks the standby published late (django_locks_catch_up)
    missed: int = 0  # ticks nobody published (between the holder's last and the standby's first)
    unreported: int = 0  # of those, not named by the standby's WARNING
    over_reported: int = 0  # ticks the WARNING named that had been published
    maybe: int = 0  # "recorded, maybe not published" lines
    duplicates: int = 0
    takeover: float | None = None  # kill -> the standby took the owner lease (its log)
    first_run: float | None = None  # kill -> the worker ran the standby's first tick


class Ticks:
    """Tick arithmetic for one period, aligned or with beat's tolerance."""

    def __init__(self, period: float, aligned: bool) -> None:
        self.period = period
        self.aligned = aligned

    def same(self, a: float, b: float) -> bool:
        """Whether two instants are one tick."""
        if self.aligned:
            return math.floor(a / self.period) == math.floor(b / self.period)
        return abs(a - b) < self.period / 2

    def holes(self, times: list[float]) -> list[tuple[float, float, int]]:
        """``(a, b, n)``: consecutive ticks of ``times`` with ``n`` ticks nobody published
        between them."""
        out = []
        for a, b in itertools.pairwise(times):
            if self.aligned:
                n = math.floor(b / self.period) - math.floor(a / self.period) - 1
            else:
                n = round((b - a) / self.period) - 1 if b - a > self.period * 1.5 else 0
            if n > 0:
                out.append((a, b, n))
        return out

    def duplicates(self, times: list[float]) -> int:
        return sum(self.same(a, b) for a, b in itertools.pairwise(times))


def judge(
    kill: Kill, task: str, catch_up: bool, runs: list[dict[str, Any]], ticks: Ticks
) -> Verdict:
    """The verdict of one entry (task ``task``, entry and key named after it) for ``kill``.

    Every tick the standby skipped between the holder's last publication and its own takeover
    was published (by the holder, or late by the standby: one tick, within half a period), or
    the standby's WARNING names it. With an aligned schedule, also every tick due in that time.
    """
    verdict = Verdict(kill.scenario, task, catch_up)
    problems = verdict.problems
    key = f"{task}:owner"
    said = reports(kill.log, kill.since, task, key)
    verdict.maybe = len(said.maybe)
    mine = sorted(scheduled(r) for r in runs if r["beat"] == kill.holder)
    theirs = sorted((r for r in runs if r["beat"] == kill.standby), key=scheduled)
    normal = [scheduled(r) for r in theirs if r["catch_up"] != "1"]
    late = [scheduled(r) for r in theirs if r["catch_up"] == "1"]
    if not mine or not normal or said.took is None:
        problems.append(
            f"no tick from the holder ({mine}) or the standby ({normal}), or no "
            f"takeover in its log ({said.took})"
        )
        return verdict
    last, first = mine[-1], normal[0]
    verdict.takeover = said.took - kill.at
    verdict.first_run = min(r["at"] for r in theirs) - kill.at
    sequence = sorted([last, *(scheduled(r) for r in runs if last < scheduled(r) < first), first])
    published = sorted(scheduled(r) for r in runs)
    on_time = sorted(scheduled(r) for r in runs if r["catch_up"] != "1")
    verdict.duplicates = ticks.duplicates(sequence)
    if verdict.duplicates:
        problems.append(f"published twice: {sequence}")
    verdict.caught_up = len(late)
    if late and not catch_up:
        problems.append(f"caught up without catch_up: {late}")
    if len(late) > 1:
        problems.append(f"more than one tick caught up: {late}")
    for t in late:
        if not any(ticks.same(p, t) for p in said.published):
            problems.append(f"the tick caught up ({t:.3f}) is not the one the WARNING names")
    recorded = None
    if kill.scenario == "record" and kill.said is not None and catch_up:
        recorded = kill.said["tick_ms"] / 1000
    verdict.over_reported = sum(any(ticks.same(t, p) for p in on_time) for t in said.missed)
    if catch_up and verdict.over_reported:
        problems.append(f"catch_up: published ticks reported missed: {said.missed}")
    # The standby's own ticks, as it saw them.
    for skip in (t for t in said.skips if last < t <= said.took):
        if any(ticks.same(skip, p) for p in published):
            continue
        if recorded is not None and ticks.same(skip, recorded):
            continue  # "recorded, maybe not published": checked below
        verdict.missed += 1
        if not any(abs(skip - t) < 0.01 for t in said.missed):
            verdict.unreported += 1
            problems.append(f"the standby skipped {skip:.3f}: not published, not reported")
        elif catch_up and ticks.aligned:
            problems.append(f"catch_up: the tick it skipped at {skip:.3f} was never published")
    # Every tick due, on the aligned schedule's instants.
    for a, _, n in ticks.holes(sequence) if ticks.aligned else []:
        for due in (a + (i + 1) * ticks.period for i in range(n)):
            if recorded is not None and ticks.same(due, recorded):
                continue
            if not any(ticks.same(t, due) for t in said.missed):
                problems.append(f"the tick due at {due:.0f} was not published, not reported")
    if kill.scenario == "before":
        assert kill.due is not None
        verdict.late = last > kill.due - ticks.period / 2
        if not verdict.late:
            victim = [p for p in published if ticks.same(p, kill.due)]
            if catch_up and len(late) != 1:
                problems.append(f"the missed tick was not caught up once: {late}")
            if catch_up and ticks.aligned and victim != late:
                problems.append(f"the tick due {kill.due} published as {victim}, not caught up")
            if not catch_up and ticks.aligned and victim:
                problems.append(f"the tick due {kill.due} was published: {victim}")
            if not catch_up and not said.missed:
                problems.append("no WARNING naming the missed tick")
            if not catch_up and "missed" not in said.codes:
                problems.append(f"no run_skipped code 'missed' (codes {said.codes})")
    elif kill.scenario == "after" and kill.said is not None:
        tick = datetime.datetime.fromisoformat(kill.said["scheduled"][key]).timestamp()
        if not ticks.same(tick, last):
            problems.append(f"the holder's last tick {last:.3f} is not the hook's {tick:.3f}")
        if any(ticks.same(tick, scheduled(r)) for r in theirs):
            problems.append(f"the standby published the holder's last tick {tick:.3f} again")
    elif recorded is not None:
        if any(ticks.same(recorded, p) for p in published):
            problems.append(f"the tick recorded before the kill ({recorded:.3f}) was published")
        iso = datetime.datetime.fromtimestamp(recorded, datetime.UTC).isoformat()
        if iso not in said.maybe:
            problems.append(f"not reported 'recorded, maybe not published': {iso} ({said.maybe})")
    if problems:
        problems.insert(0, f"{kill.scenario} kill of {kill.holder} at {kill.at:.3f}, {task}:")
        problems.append(f"holder's last {last:.3f}, standby's first {first:.3f}, caught up {late}")
        problems.append("the standby's lines:\n    " + "\n    ".join(said.lines))
    return verdict


def summary(verdicts: list[Verdict]) -> dict[str, Any]:
    """The figures of a group of verdicts (one scenario and entry kind)."""
    takeovers = [v.takeover for v in verdicts if v.takeover is not None]
    runs_after = [v.first_run for v in verdicts if v.first_run is not None]
    return {
        "runs": len(verdicts),
        "late_kills": sum(v.late for v in verdicts),
        "caught_up": sum(v.caught_up for v in verdicts),
        "missed": sum(v.missed for v in verdicts),
        "unreported": sum(v.unreported for v in verdicts),
        "over_reported": sum(v.over_reported for v in verdicts),
        "maybe_not_published": sum(v.maybe for v in verdicts),
        "duplicates": sum(v.duplicates for v in verdicts),
        "takeover_s": _spread(takeovers),
        "first_run_s": _spread(runs_after),
    }


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.2f}/{statistics.median(values):.2f}/{max(values):.2f} (min/median/max)"


def rejudge(path: str, tasks: dict[str, bool], period: float) -> list[Verdict]:
    """The verdicts of a saved run (the test's ``kills.json``)."""
    import json

    with open(path, encoding="utf-8") as fh:
        saved = json.load(fh)
    ticks = Ticks(period, saved["aligned"])
    runs = saved["runs"]
    return [
        judge(Kill(**kill), task, catch_up, [r for r in runs if r["task"] == task], ticks)
        for kill in saved["kills"]
        for task, catch_up in tasks.items()
    ]
