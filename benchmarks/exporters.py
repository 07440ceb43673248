"""The metrics exporters' cost: ``python -m benchmarks --exporters`` (issue 21, SPEC section 11).

The Python work added per acquire + release with the exporters of ``LOCKS["METRICS"]`` on: a
``Locks(InMemoryStore())`` acquire then release in a loop (no I/O), with no exporter, each one
alone and both, in interleaved runs (each mode's runs see the same machine), the median of the
runs compared. The OpenTelemetry SDK is configured as a project would (global providers set
before the exporter is turned on): a ``MeterProvider`` with an ``InMemoryMetricReader`` and a
``TracerProvider`` with a ``SimpleSpanProcessor`` on a span exporter that drops the spans. The
Prometheus exporter runs on ``prometheus-client``'s default registry (one process). Each run
ends with a collection of the OpenTelemetry reader, timed with the run: the OpenTelemetry
exporter records the acquire waits it kept when a reader collects, so that work is counted
(every mode collects, the baseline too). Times are this process's CPU time
(``time.process_time``: every thread), so the machine's other processes do not count.
``acquire()`` makes no span; a ``lock()`` block makes two (``lock.acquire``, ``lock.hold``):
measured in a second table.

:func:`measure` gives the figures the goal reads (at most 10 us added with both on); another
caller can run it with small counts (``QUICK``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.measure import table

GOAL_US = 10.0
KEY = "bench:exporters"
EXPORTERS = ("opentelemetry", "prometheus")


@dataclasses.dataclass(frozen=True)
class ExportersPlan:
    pairs: int = 20_000
    runs: int = 7
    warmup: int = 1000


QUICK = ExportersPlan(pairs=500, runs=2, warmup=50)


def say(text: str = "") -> None:
    print(text, flush=True)


def configure_django() -> None:
    """Django with django_locks on the in-memory store and no exporter (turned on per mode)."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DEBUG=True,
            USE_TZ=True,
            INSTALLED_APPS=["django_locks"],
            LOCKS={"BACKEND": "django_locks.stores.InMemoryStore", "METRICS": []},
            LOGGING_CONFIG=None,
        )
    django.setup()


def configure_opentelemetry_sdk() -> Any:
    """The global providers of the SDK, as a project sets them: the metric reader returned."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        """A span exporter that does nothing: the SDK's work per span, no export's."""

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(Dropped()))
    trace.set_tracer_provider(tracer_provider)
    return reader


def available() -> list[str]:
    """The exporters that exist in this checkout with their library installed."""
    from django_locks.exporters import MODULES

    found = []
    for name in EXPORTERS:
        module, _distribution, top = MODULES[name]
        if importlib.util.find_spec(top) is not None and importlib.util.find_spec(module):
            found.append(name)
    return found


def modes(names: Sequence[str]) -> dict[str, list[str]]:
    """The modes measured: no exporter, each alone, and all of them together."""
    found: dict[str, list[str]] = {"none": []}
    for name in names:
        found[f"{name} only" if len(names) > 1 else name] = [name]
    if len(names) > 1:
        found["both" if len(names) == 2 else "all"] = list(names)
    return found


def per_pair(
    operation: Callable[[], None], pairs: int, collect: Callable[[], object] | None = None
) -> float:
    """CPU seconds of this process per call of ``operation``, over ``pairs`` calls and then
    one ``collect()`` (a metric reader's collection) when given."""
    began = time.process_time()
    for _ in range(pairs):
        operation()
    if collect is not None:
        collect()
    return (time.process_time() - began) / pairs


def measure(
    plan: ExportersPlan = ExportersPlan(),
    names: Sequence[str] | None = None,
    collect: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """Median CPU microseconds per acquire + release (``acquire``) and per ``lock()`` block
    (``lock``) in each mode, the microseconds added and the ratio to no exporter. ``collect``:
    a metric reader's collection, run at the end of each timed run (see the module)."""
    from django_locks import Locks, exporters
    from django_locks.stores import InMemoryStore

    locks = Locks(InMemoryStore())

    def acquire_release() -> None:
        lock = locks.acquire(KEY)
        assert lock is not None
        lock.release()

    def lock_block() -> None:
        with locks.lock(KEY):
            pass

    chosen = modes(available() if names is None else names)
    operations = {"acquire": acquire_release, "lock": lock_block}
    samples: dict[str, dict[str, list[float]]] = {op: {m: [] for m in chosen} for op in operations}
    try:
        order = list(chosen.items())
        for run in range(plan.runs):
            # Each run starts with another mode: the first of a run reads low (a warm cache).
            for mode, on in order[run % len(order) :] + order[: run % len(order)]:
                exporters.configure(on)
                for op, operation in operations.items():
                    per_pair(operation, plan.warmup, collect)
                    samples[op][mode].append(per_pair(operation, plan.pairs, collect))
    finally:
        exporters.configure([])
    figures: dict[str, Any] = {"plan": dataclasses.asdict(plan), "modes": chosen}
    for op in operations:
        base = statistics.median(samples[op]["none"])
        figures[op] = {
            mode: {
                "median_us": round(statistics.median(runs) * 1e6, 2),
                "added_us": round((statistics.median(runs) - base) * 1e6, 2),
                "ratio": round(statistics.median(runs) / base, 2),
                "runs_us": [round(s * 1e6, 2) for s in runs],
            }
            for mode, runs in samples[op].items()
        }
    return figures


def collection_us(reader: Any, times: int = 20) -> float:
    """Median microseconds of one collection of the OpenTelemetry reader (its callbacks reading
    the exporter's counts, the histograms' points): per scrape, not per acquire."""
    taken = []
    for _ in range(times):
        began = time.perf_counter()
        reader.get_metrics_data()
        taken.append(time.perf_counter() - began)
    return statistics.median(taken) * 1e6


def multiprocess(plan: ExportersPlan) -> dict[str, Any]:
    """:func:`measure` in a child process in prometheus-client's multiprocess mode, as a
    gunicorn or Celery prefork worker runs (``PROMETHEUS_MULTIPROC_DIR`` set before the library
    is imported): every value the Prometheus exporter updates is written to the process's mmap
    file. The child is this module run with ``-m`` (below)."""
    with tempfile.TemporaryDirectory(prefix="django_locks-prometheus-") as directory:
        plan_json = json.dumps(dataclasses.asdict(plan))
        env = {"PROMETHEUS_MULTIPROC_DIR": directory}
        return child("benchmarks.exporters", [plan_json], env, "the multiprocess benchmark")


def child(module: str, args: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    """Run ``python -m module *args`` (its own Django settings: none inherited, ``env`` added)
    and return the JSON document of its last line of output."""
    inherited = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**inherited, **env},
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr}")
    figures: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main(quick: bool = False) -> dict[str, Any]:
    """Run :func:`measure` as ``--exporters`` does and print its tables."""
    configure_django()
    reader = (
        configure_opentelemetry_sdk() if importlib.util.find_spec("opentelemetry.sdk") else None
    )
    plan = QUICK if quick else ExportersPlan()
    names = available()
    say(
        f"== The exporters' cost: CPU us per acquire + release on InMemoryStore, median of "
        f"{plan.runs} interleaved runs of {plan.pairs:,} =="
    )
    if "prometheus" not in names:
        say("(django_locks.contrib.prometheus or prometheus-client missing: not measured)")
    figures = measure(plan, names, reader.get_metrics_data if reader is not None else None)
    for op, title in (
        ("acquire", "acquire() + release(): no span"),
        ("lock", "with lock(): 2 spans"),
    ):
        say(title)
        say(
            table(
                ["mode", "us per pair", "added", "ratio"],
                [
                    [mode, f"{f['median_us']:.2f}", f"{f['added_us']:+.2f}", f"{f['ratio']:.2f}x"]
                    for mode, f in figures[op].items()
                ],
            )
        )
        say()
    all_on = list(figures["modes"])[-1]
    added = figures["acquire"][all_on]["added_us"]
    figures["goal"] = {
        "mode": all_on,
        "added_us": added,
        "goal_us": GOAL_US,
        "met": added <= GOAL_US,
    }
    say(
        f"Goal (issue 21): at most {GOAL_US:g} us added per acquire + release with "
        f"{all_on}: {added:.2f} us, {'met' if added <= GOAL_US else 'MISSED'}"
    )
    if "prometheus" in names:
        figures["multiprocess"] = mp = multiprocess(plan)
        say("acquire() + release() in prometheus-client's multiprocess mode (values in mmap files)")
        rows = [
            [m, f"{f['median_us']:.2f}", f"{f['added_us']:+.2f}"] for m, f in mp["acquire"].items()
        ]
        say(table(["mode", "us per pair", "added"], rows))
        say()
    if reader is not None and "opentelemetry" in names:
        from django_locks import exporters

        exporters.configure(["opentelemetry"])
        try:
            figures["collection_us"] = round(collection_us(reader), 1)
        finally:
            exporters.configure([])
        say(
            "One OpenTelemetry collection with nothing new (the reader's get_metrics_data): "
            f"{figures['collection_us']} us"
        )
    if len(names) == 2:
        say()
        figures["round_trips"] = trips = round_trips(quick)
        say("Against real round trips: wall us per acquire + release, no exporter and both")
        if "unavailable" in trips:
            say(f"  not measured: {trips['unavailable']}")
        else:
            rows = [
                [store, f"{trips[store]['none_us']:.1f}", f"{trips[store]['both_us']:.1f}",
                 f"{trips[store]['ratio']:.3f}x"]
                for store in ("postgres", "redis")
            ]  # fmt: skip
            say(table(["store", "none", "both", "ratio"], rows))
            say(f"  (median of {trips['runs']} interleaved runs of {trips['pairs']} pairs)")
    return figures


def round_trips(quick: bool) -> dict[str, Any]:
    """``benchmarks/exporters_io.py`` in a child process: the ratio with both exporters on
    against the round trips of PostgreSQL and Redis (servers started by the child)."""
    args = ["--quick"] if quick else []
    return child("benchmarks.exporters_io", args, {}, "the round-trip benchmark")


if __name__ == "__main__":  # the child of multiprocess(): its figures as JSON on stdout
    configure_django()
    sdk = configure_opentelemetry_sdk() if importlib.util.find_spec("opentelemetry.sdk") else None
    child_plan = ExportersPlan(**json.loads(sys.argv[1]))
    print(json.dumps(measure(child_plan, available(), sdk.get_metrics_data if sdk else None)))
