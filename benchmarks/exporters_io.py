"""The exporters' cost against real round trips: acquire + release on PostgreSQL and Redis with no
exporter and with both, interleaved (issue 21: "the round-trip ratio with them on reported").

Run by ``python -m benchmarks --exporters`` in a child process of its own (Django's settings are
configured once a process, and this one needs a database store on the benchmark's PostgreSQL);
prints its figures as JSON on stdout.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from benchmarks.environment import Unavailable, configure_django, servers

RUNS = 7
PAIRS = 500
WARMUP = 50


def per_pair(locks: Any, key: str, pairs: int) -> float:
    """Wall seconds per acquire + release of ``key``, over ``pairs`` of them."""
    began = time.perf_counter()
    for _ in range(pairs):
        lock = locks.acquire(key)
        assert lock is not None
        lock.release()
    return (time.perf_counter() - began) / pairs


def measure(runs: int, pairs: int) -> dict[str, Any]:
    """Median wall microseconds per pair on each store, with no exporter and with both."""
    from benchmarks.exporters import configure_opentelemetry_sdk
    from django_locks import Locks, exporters
    from django_locks.stores import DatabaseStore, RedisStore

    reader = configure_opentelemetry_sdk()
    figures: dict[str, Any] = {"runs": runs, "pairs": pairs}
    with servers({"postgres", "redis"}) as started:
        configure_django(started["postgres"])
        stores = {
            "postgres": DatabaseStore("default"),
            "redis": RedisStore(url=started["redis"].url),
        }
        for name, store in stores.items():
            locks = Locks(store)
            samples: dict[str, list[float]] = {"none": [], "both": []}
            for _ in range(runs):
                for mode, on in (("none", []), ("both", ["opentelemetry", "prometheus"])):
                    exporters.configure(on)
                    per_pair(locks, f"bench-io:{name}", WARMUP)
                    samples[mode].append(per_pair(locks, f"bench-io:{name}", pairs))
                    reader.get_metrics_data()  # a scrape between runs, as a collector makes
            exporters.configure([])
            none, both = (statistics.median(samples[mode]) for mode in ("none", "both"))
            figures[name] = {
                "none_us": round(none * 1e6, 1),
                "both_us": round(both * 1e6, 1),
                "ratio": round(both / none, 3),
                "runs_us": {
                    mode: [round(s * 1e6, 1) for s in runs_] for mode, runs_ in samples.items()
                },
            }
            store.close()
    return figures


if __name__ == "__main__":
    quick = len(sys.argv) > 1 and sys.argv[1] == "--quick"
    try:
        result = measure(2 if quick else RUNS, 20 if quick else PAIRS)
    except Unavailable as exc:
        result = {"unavailable": str(exc)}
    print(json.dumps(result))
