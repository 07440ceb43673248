"""The checker's figures: how late ``deadline`` losses were announced (``lost_by`` counted on the
way), the takeover after a holder's crash and, on etcd, how it compares with P5's bound there
(tests/faults/checker.py's ``Report``)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.faults.checker import Report, Window

PAUSES = {"holder_pause", "leader_pause"}
CRASHES = {"holder_kill", "leader_kill"}


def stopped(pid: int, instant: float, faults: list[dict[str, Any]]) -> bool:
    return any(
        f.get("pid") == pid and f["start"] - 0.05 <= instant <= f["end"] + 0.05
        for f in faults
        if f["kind"] in PAUSES
    )


def lateness(
    losses: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    late_oks: set[tuple[int, str, int]],
    report: Report,
) -> None:
    for loss in losses:
        report.lost_by[loss["by"]] += 1
        if loss["by"] != "deadline" or loss.get("deadline") is None:
            continue
        # An acquire whose answer came after its deadline is lost the moment it arrives: that
        # is the late reply, not the engine's lateness.
        if (loss["pid"], loss["key"], loss["token"]) in late_oks:
            continue
        # A process stopped at its deadline learns it when it runs again: that is the pause,
        # not the engine's lateness.
        if stopped(loss["pid"], loss["deadline"], faults):
            continue
        report.lateness.append(loss["t"] - loss["deadline"])


def takeover(by_kind: dict[str, list[dict[str, Any]]], report: Report) -> None:
    # With permits, a crashed holder's takeover is the next acquire of its own slot (another
    # slot may well be free sooner).
    starts: dict[str, list[tuple[float, int]]] = defaultdict(list)
    slots: dict[tuple[int, str, int], str] = {}
    for event in by_kind["ok"]:
        slot = event["key"] if event.get("permit") is None else f"{event['key']}#{event['permit']}"
        slots[(event["pid"], event["key"], event["token"])] = slot
        starts[slot].append((event["t"], event["pid"]))
    for write in by_kind["write"]:
        if write["kind"] == "leader" and write["accepted"]:
            starts[write["key"]].append((write["start"], write["pid"]))
    for instants in starts.values():
        instants.sort()
    for fault in by_kind["fault"]:
        if fault["kind"] not in CRASHES or fault.get("key") is None:
            continue
        slot = slots.get((fault["pid"], fault["key"], fault.get("token", -1)), fault["key"])
        after = [t for t, pid in starts[slot] if t > fault["start"] and pid != fault["pid"]]
        if after:
            report.takeover.append(after[0] - fault["start"])
            report.crashes.append((fault["start"], after[0] - fault["start"], slot))
    p5_excess(by_kind, report)


def p5_excess(by_kind: dict[str, list[dict[str, Any]]], report: Report) -> None:
    """On etcd, and through the failovers of tests/faults/replication.py with no election
    timeout (the run's ``cluster`` event gives the ttl and the election timeout): each
    crash against P5's bound there, "the effective ttl, plus the election timeout when the
    leader changed". With a new leader elected between the crash and the takeover (an etcd
    fault's ``elected``: when the nemesis saw it, a little after the fact), the bound counts
    from that election, since the new leader restarts every lease at its full TTL plus an
    election timeout; else from the crash.

    ``p5_excess``: the takeover minus the bound, how late the key was free at most (a takeover
    also waits for a waiter: one may come late, when every waiter had given up meanwhile).
    ``p5_held``: the send of the last acquire of the key refused before the takeover, minus the
    bound, how late it was still held at least: above 0 proves the key outlived the bound."""
    if not by_kind["cluster"]:
        return
    cluster = by_kind["cluster"][0]
    ttl, election = float(cluster["ttl"]), float(cluster.get("election_s", 1.0))
    elections = sorted(f["elected"] for f in by_kind["fault"] if f.get("elected") is not None)
    refused: dict[str, list[float]] = defaultdict(list)
    for call in by_kind["acall"]:
        if not call["granted"]:
            refused[call["key"]].append(call["sent"])
    for start, took, slot in report.crashes:
        changed = [t for t in elections if start < t < start + took]
        bound = ttl + (changed[-1] - start + election if changed else 0.0)
        report.p5_excess.append(took - bound)
        # A permit's refused acquire says its key is full, not which slot: plain keys only.
        tries = [t for t in refused[slot] if start < t < start + took]
        if tries and "#" not in slot:
            report.p5_held.append(max(tries) - start - bound)


def longest_gap(windows: list[Window], report: Report) -> None:
    """The longest time a key (a permit's slot) went without a valid holder between two of its
    holders: a crash's takeover, or, much longer, a key nobody could take although it was not
    held (on etcd, a key left on a lease its process goes on renewing)."""
    per_slot: dict[str, list[Window]] = defaultdict(list)
    for window in windows:
        if not window.empty:
            per_slot[window.slot].append(window)
    for held in per_slot.values():
        held.sort(key=lambda w: w.start)
        until = held[0].end
        for window in held[1:]:
            report.gap_max = max(report.gap_max, window.start - until)
            until = max(until, window.end)
