"""``python -m tests.faults.table [--recheck] [--jobs | --atomic | --etcd | --failover]
MATRIX.json|report.json
...``: the matrix results as the docs' RST table (``--recheck``: each run's saved histories checked
again by the current checker; ``--jobs``: the replace and max_hold scenarios' own counts and
figures; ``--atomic``: both canaries' lost updates, how the atomic canary's blocks ended and the
store acquire calls' times; ``--etcd``: the figures issue 28 asks of the etcd store, each violation
the issue names in a column of its own, the takeover against P5's bound on etcd; ``--failover``:
the same columns for the failover scenarios of issue 29, whose P5 bound is the ttl).

One row per scenario and store: the runs' operations, faults and counts summed; the lateness and
takeover figures (and the jobs' figures) as the worst run's (each run's percentiles are over its
own history). A single run's ``report.json`` counts as a matrix of that one run.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from tests.faults.checker import check, read_history
from tests.faults.harness import SCENARIOS

COLUMNS = [
    "scenario",
    "store",
    "runs",
    "ops",
    "faults",
    "violations",
    "locks lost",
    "fenced writes refused",
    "canary lost updates",
    "lateness ms: worst p50 / p99 / max",
    "takeover s: worst p50 / p99",
]


def worst(runs: list[dict[str, Any]], name: str) -> float:
    values = [run[name] for run in runs if not math.isnan(run.get(name, math.nan))]
    return max(values) if values else math.nan


def figures(values: list[float]) -> str:
    return "--" if all(math.isnan(v) for v in values) else " / ".join(f"{v:g}" for v in values)


def row(scenario: str, store: str, runs: list[dict[str, Any]]) -> list[str]:
    faults: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    for run in runs:
        faults.update(run["faults"])
        lost.update(run["lost_by"])
    violations = sum(sum(run["violations"].values()) for run in runs)
    kinds = Counter({k: v for run in runs for k, v in run["violations"].items() if v})
    if kinds:
        counted = f"{violations} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})"
    else:
        counted = str(violations)
    return [
        f"``{scenario}``",
        store,
        str(len(runs)),
        str(sum(run["operations"] for run in runs)),
        ", ".join(f"{k} {v}" for k, v in sorted(faults.items())) or "none",
        counted,
        ", ".join(f"{k} {v}" for k, v in sorted(lost.items())) or "0",
        str(sum(run["refused_fenced"] for run in runs)),
        str(sum(run["canary_lost"] for run in runs)),
        figures([worst(runs, f"lateness_{q}_ms") for q in ("p50", "p99", "max")]),
        figures([worst(runs, f"takeover_{q}_s") for q in ("p50", "p99")]),
    ]


JOBS_COLUMNS = ["scenario", "store", "runs", "ops", "faults", "violations", "counts"]
SAMPLES = {
    "replace": ["notice_s", "replaced_s"],
    "max_hold": ["cap_late_ms", "announce_ms", "taken_s"],
}
"""The jobs tables' figures (tests/faults/job_checks.py), each a column of worst p50 / p99 /
max."""


def jobs_row(scenario: str, store: str, runs: list[dict[str, Any]]) -> list[str]:
    counts: Counter[str] = Counter()
    for run in runs:
        counts.update(run.get("jobs", {}))
    return [
        *row(scenario, store, runs)[:6],
        ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none",
        *(
            figures([worst(runs, f"{name}_{q}") for q in ("p50", "p99", "max")])
            for name in SAMPLES[scenario]
        ),
    ]


ATOMIC_COLUMNS = [
    "scenario",
    "store",
    "runs",
    "ops",
    "faults",
    "violations",
    "locks lost",
    "canary lost updates",
    "atomic canary lost updates",
    "atomic blocks: committed / refused / failed / refused at entry",
    "acquire call ms: worst p99 / max",
    "acquire calls during a commit: n, max ms",
]


def atomic_row(scenario: str, store: str, runs: list[dict[str, Any]]) -> list[str]:
    ends: Counter[str] = Counter()
    for run in runs:
        ends.update(run.get("atomic", {}))
    base = row(scenario, store, runs)
    return [
        *base[:7],
        base[8],
        str(sum(run.get("atomic_canary_lost", 0) for run in runs)),
        " / ".join(str(ends[k]) for k in ("committed", "refused", "failed", "refused_entry")),
        figures([worst(runs, f"acquire_call_{q}_ms") for q in ("p99", "max")]),
        f"{sum(run.get('pending_wait_n', 0) for run in runs)}, "
        + figures([worst(runs, "pending_wait_max_ms")]),
    ]


ETCD_COLUMNS = [
    "scenario",
    "runs",
    "ops",
    "faults",
    "overlaps",
    "duplicate / decreasing tokens",
    "stale fenced writes",
    "other violations",
    "locks lost",
    "fenced writes refused",
    "lateness ms: worst p50 / p99 / max",
    "takeover s: worst p50 / p99 / max",
    "takeover minus P5's bound, s: worst (last refused acquire minus the bound)",
    "longest a key went untaken, s: worst",
]


def etcd_row(scenario: str, store: str, runs: list[dict[str, Any]]) -> list[str]:
    def total(*names: str) -> int:
        return sum(run["violations"].get(name, 0) for run in runs for name in names)

    base = row(scenario, store, runs)
    named = ("overlap", "duplicate_token", "token_order", "stale_write")
    other = sum(sum(run["violations"].values()) for run in runs) - total(*named)
    return [
        base[0],
        *base[2:5],
        str(total("overlap")),
        f"{total('duplicate_token')} / {total('token_order')}",
        str(total("stale_write")),
        str(other),
        *base[6:8],
        base[9],
        figures([worst(runs, f"takeover_{q}_s") for q in ("p50", "p99", "max")]),
        _p5(runs),
        figures([worst(runs, "gap_max_s")]),
    ]


def _p5(runs: list[dict[str, Any]]) -> str:
    excess, held = worst(runs, "p5_excess_max_s"), worst(runs, "p5_held_max_s")
    if math.isnan(held):
        return figures([excess])
    return f"{excess:g} ({held:g})"


def rst(rows: list[list[str]]) -> str:
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for cells in rows:
        lines.append(f"   * - {cells[0]}")
        lines.extend(f"     - {cell}" for cell in cells[1:])
    return "\n".join(lines)


def table(
    results: list[dict[str, Any]],
    jobs: bool = False,
    atomic: bool = False,
    etcd: bool = False,
    failover: bool = False,
) -> str:
    """The RST table of ``results``; with ``jobs``, one table per jobs scenario found; with
    ``atomic``, the atomic canary's; with ``etcd``, the etcd runs' (issue 28's figures)."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        grouped[result["scenario"], result["store"]].append(result)
    order = list(SCENARIOS)
    keys = sorted(grouped, key=lambda k: (order.index(k[0]), k[1]))
    if atomic:
        return rst([ATOMIC_COLUMNS, *(atomic_row(s, st, grouped[s, st]) for s, st in keys)])
    if etcd or failover:  # the same columns; --etcd keeps the etcd store's runs
        rows = [etcd_row(s, st, grouped[s, st]) for s, st in keys if failover or st == "etcd"]
        return rst([ETCD_COLUMNS, *rows])
    if not jobs:
        return rst([COLUMNS, *(row(s, store, grouped[s, store]) for s, store in keys)])
    tables = []
    for scenario, names in SAMPLES.items():
        header = JOBS_COLUMNS + [f"{name}: worst p50 / p99 / max" for name in names]
        rows = [jobs_row(s, store, grouped[s, store]) for s, store in keys if s == scenario]
        if rows:
            tables.append(rst([header, *rows]))
    return "\n\n".join(tables)


def loaded(path: Path) -> list[dict[str, Any]]:
    """A matrix.json's results, or a run's report.json as a matrix of that one run."""
    data = json.loads(path.read_text())
    if isinstance(data, list):
        return data
    config = data["config"]
    return [{"scenario": config["scenario"], "store": config["store"], **data}]


def rechecked(path: Path) -> list[dict[str, Any]]:
    """The results of ``path`` (a matrix.json or a report.json) from its runs' saved histories,
    checked again by the current checker (after a fix to the checker, say)."""
    results = loaded(path)
    for index, result in enumerate(results):
        if path.name == "report.json":
            run = path.parent
        else:  # Results written before "run" was recorded: the default first seed, 1.
            seed = result["seed"]
            run = path.parent / (
                result.get("run") or f"{result['store']}-{result['scenario']}-{seed - 1}"
            )
        report = check(read_history(sorted(run.glob("*.jsonl"))))
        results[index] = {**result, **report.as_dict()}
    return results


def main(args: list[str]) -> int:
    flags = ("--recheck", "--jobs", "--atomic", "--etcd", "--failover")
    paths = [Path(arg) for arg in args if arg not in flags]
    load = rechecked if "--recheck" in args else loaded
    results = [result for path in paths for result in load(path)]
    kinds = {name: f"--{name}" in args for name in ("jobs", "atomic", "etcd", "failover")}
    print(table(results, **kinds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
