"""The OpenTelemetry exporter of ``LOCKS["METRICS"] = ["opentelemetry"]``: metrics and spans."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Status, StatusCode

import django_locks
from django_locks import process  # noqa: F401 (its at-fork hook resets these counts: see there)
from django_locks.events import Event

__all__ = ["NAME", "RECORD_AT", "RENEWAL_BUCKETS", "WAIT_BUCKETS", "consume", "use"]

NAME = "django_locks"
"""The meter's and the tracer's name (their version: django_locks')."""

WAIT_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
)  # fmt: skip
"""The bucket boundaries ``django_locks.acquire.duration`` advises (seconds; the SDK's default
ones are for milliseconds): a free key answers in one round trip, a waited one in up to
``wait``. The Prometheus exporter's, so that both read alike."""

RENEWAL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""The bucket boundaries ``django_locks.renewal.duration`` advises (seconds): one round trip
renewing every lock of a store."""

RECORD_AT = 4096
"""How many acquire waits (of one label, store and outcome) are kept for the next collection at
most: past it they are recorded at once (where no reader collects, as with the API's no-op
provider, they would pile up)."""

SPANNED = frozenset({"lock", "run"})
# Leaderships and owner leases last days: gauges tell of them, not spans (SPEC section 11).


class _Outcome:
    """The acquisitions of one (label, store) that went one way: their count, their attributes
    (made once: the SDK hashes them on every measurement), the waits not recorded yet."""

    __slots__ = ("attributes", "count", "waits")

    def __init__(self, attributes: dict[str, str]) -> None:
        self.attributes = attributes
        self.count = 0
        self.waits: list[float] = []


class _Cell:
    """The counts of one (label, store), which the observable instruments read at collection;
    changed under ``_mutex`` only."""

    __slots__ = ("attributes", "by", "held", "lost", "outcomes", "owner", "owns", "skipped")

    def __init__(self, label: str, store: str) -> None:
        self.attributes = {"lock.label": label, "lock.store": store}
        self.by: dict[tuple[str, str], dict[str, str]] = {}
        self.outcomes: dict[str, _Outcome] = {}
        self.lost: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.held = 0
        self.owner = 0
        self.owns = False  # whether it ever had owner leases: the others report none

    def with_(self, name: str, value: str) -> dict[str, str]:
        """The attributes with ``name: value`` added, made once each."""
        found = self.by.get((name, value))
        if found is None:
            found = self.by[(name, value)] = {**self.attributes, name: value}
        return found

    def outcome(self, outcome: str) -> _Outcome:
        """The acquisitions that went ``outcome`` (made on the first; under ``_mutex``)."""
        found = self.outcomes.get(outcome)
        if found is None:
            found = self.outcomes[outcome] = _Outcome(self.with_("lock.outcome", outcome))
        return found


_mutex = threading.Lock()
_cells: dict[tuple[str, str], _Cell] = {}
_leaders: dict[tuple[str, str], list[Any]] = {}  # (election, store) -> [1 or 0, attributes]
_renewal_attributes: dict[tuple[str, str], dict[str, str]] = {}
_wait: Any = None
_renewal: Any = None
_tracer: Any = None


def use(
    meter_provider: metrics.MeterProvider | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> None:
    """Take the instruments from ``meter_provider`` and the tracer from ``tracer_provider``
    (default: the global ones, which is what importing this module does), counting afresh.

    For tests, which cannot set OpenTelemetry's global providers more than once a process. In
    a project, configure the SDK's global providers instead: instruments made on them before
    the SDK is set up start reporting once it is."""
    global _cells, _leaders, _wait, _renewal, _tracer
    version = django_locks.__version__
    meter = metrics.get_meter(NAME, version, meter_provider=meter_provider)
    wait = meter.create_histogram(
        "django_locks.acquire.duration",
        unit="s",
        description="How long acquiring a lock took, waiting included, by how it went.",
        explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
    )
    renewal = meter.create_histogram(
        "django_locks.renewal.duration",
        unit="s",
        description="The round trip of one renewal of the locks this process holds on a store.",
        explicit_bucket_boundaries_advisory=RENEWAL_BUCKETS,
    )
    # The counts these instruments read: the previous providers keep reading theirs.
    reading = _Reading({}, {}, wait)
    meter.create_observable_counter(
        "django_locks.acquisitions",
        [reading.observe_acquisitions],
        unit="{acquisition}",
        description="Acquire calls, by how they went: acquired, taken, aborted or error.",
    )
    meter.create_observable_up_down_counter(
        "django_locks.held",
        [reading.observe_held],
        unit="{lock}",
        description="Locks this process holds now.",
    )
    meter.create_observable_counter(
        "django_locks.lost",
        [reading.observe_lost],
        unit="{lock}",
        description="Locks lost while held, by what detected it.",
    )
    meter.create_observable_counter(
        "django_locks.run.skipped",
        [reading.observe_skipped],
        unit="{run}",
        description="Runs of decorated jobs skipped, by why.",
    )
    meter.create_observable_up_down_counter(
        "django_locks.leader",
        [reading.observe_leaders],
        unit="{leader}",
        description="1 for each election this process leads, 0 once it stopped leading.",
    )
    meter.create_observable_up_down_counter(
        "django_locks.owner_lease.count",
        [reading.observe_owner_leases],
        unit="{lease}",
        description="Owner leases (on_one_instance) this process holds now.",
    )
    tracer = trace.get_tracer(NAME, version, tracer_provider=tracer_provider)
    with _mutex:
        _cells, _leaders, _wait, _renewal, _tracer = (
            reading.cells,
            reading.leaders,
            wait,
            renewal,
            tracer,
        )


def consume(event: Event) -> None:
    """Count ``event``, keep its durations and make its spans (the event stream's consumer
    ``django_locks.exporters`` subscribes).

    An acquire's wait is kept, not recorded: the histogram's measurements cost the SDK several
    microseconds each, so they are made in one batch when a reader collects (every callback of
    the observable instruments records the waits kept, and the SDK runs them before it reads
    the histograms), on the reader's thread, off the acquiring one."""
    kind = event.kind
    if kind == "acquired" or kind == "not_acquired":
        cell = _cells.get((event.label, event.store)) or _cell(event.label, event.store)
        duration = event.duration
        full = None
        with _mutex:
            outcome = cell.outcomes.get(event.outcome) or cell.outcome(event.outcome)
            outcome.count += 1
            if duration is not None:
                outcome.waits.append(duration if duration > 0 else 0.0)
                if len(outcome.waits) >= RECORD_AT:
                    full, outcome.waits = outcome.waits, []
            if kind == "acquired":
                cell.held += 1
                if event.use == "owner":
                    cell.owner += 1
                    cell.owns = True
        if full is not None:
            _record(_wait, [(outcome.attributes, full)])
        if event.use in SPANNED:
            _span("lock.acquire", event, cell, event.outcome == "error")
    elif kind == "released" or kind == "lost":
        cell = _cells.get((event.label, event.store)) or _cell(event.label, event.store)
        with _mutex:
            cell.held -= 1
            if event.use == "owner":
                cell.owner -= 1
            if kind == "lost":
                cell.lost[event.outcome] = cell.lost.get(event.outcome, 0) + 1
        if event.use in SPANNED:
            _span("lock.hold", event, cell, kind == "lost")
    elif kind == "renewed":
        # Once a round per store, on the renewal thread: recorded at once.
        attributes = _renewal_attributes.get((event.store, event.outcome))
        if attributes is None:
            attributes = {"lock.store": event.store, "lock.outcome": event.outcome}
            _renewal_attributes[(event.store, event.outcome)] = attributes
        if event.duration is not None:
            _renewal.record(max(event.duration, 0.0), attributes)
    elif kind == "run_skipped":
        cell = _cells.get((event.label, event.store)) or _cell(event.label, event.store)
        with _mutex:
            cell.skipped[event.outcome] = cell.skipped.get(event.outcome, 0) + 1
    elif kind == "leadership_acquired" or kind == "leadership_lost":
        leading = 1 if kind == "leadership_acquired" else 0
        with _mutex:
            found = _leaders.get((event.label, event.store))
            if found is None:
                attributes = {"lock.election": event.label, "lock.store": event.store}
                _leaders[(event.label, event.store)] = [leading, attributes]
            else:
                found[0] = leading


def forget_counts_in_child() -> None:
    """After fork(), in the child (``django_locks.process.AFTER_FORK``): the parent's counts
    are not the child's (its locks were detached, it leads nothing, and the counters would be
    exported twice), and another thread may have held the mutex at fork() time."""
    global _mutex
    _mutex = threading.Lock()
    _cells.clear()  # in place: every reading of use() reads these dicts
    _leaders.clear()


def _cell(label: str, store: str) -> _Cell:
    with _mutex:
        return _cells.setdefault((label, store), _Cell(label, store))


def _record(histogram: Any, batches: list[tuple[dict[str, str], list[float]]]) -> None:
    record = histogram.record
    for attributes, waits in batches:
        for wait in waits:
            record(wait, attributes)


def _span(name: str, event: Event, cell: _Cell, failed: bool) -> None:
    """A span made after the fact: it ends now and began ``event.duration`` ago, a child of
    the context current now (the caller's, as ``lock()`` enters and leaves on its thread)."""
    end = time.time_ns()
    duration = event.duration
    start = end - int(duration * 1e9) if duration is not None and duration > 0 else end
    attributes: dict[str, str | int] = {**cell.attributes, "lock.key": event.key}
    if event.fencing_token is not None:
        attributes["lock.fencing_token"] = event.fencing_token
    if event.kind == "lost":
        attributes["lock.outcome"] = "lost"
        attributes["lock.detected_by"] = event.outcome
    else:
        attributes["lock.outcome"] = event.outcome
    span = _tracer.start_span(name, attributes=attributes, start_time=start)
    if failed:
        what = "the lock was lost" if event.kind == "lost" else "the store failed"
        span.set_status(Status(StatusCode.ERROR, what))
    span.end(end_time=end)


class _Reading:
    """The counts one :func:`use` made instruments for, and their callbacks: each records the
    waits kept (the first to run in a collection finds them), then reads its counts under the
    mutex."""

    def __init__(
        self,
        cells: dict[tuple[str, str], _Cell],
        leaders: dict[tuple[str, str], list[Any]],
        wait: Any,
    ) -> None:
        self.cells = cells
        self.leaders = leaders
        self.wait = wait

    def record_waits(self) -> None:
        """Record every acquire wait kept since the last collection."""
        with _mutex:
            batches = []
            for cell in self.cells.values():
                for outcome in cell.outcomes.values():
                    if outcome.waits:
                        batches.append((outcome.attributes, outcome.waits))
                        outcome.waits = []
        if batches:
            _record(self.wait, batches)

    def by(self, name: str, counts_of: Callable[[_Cell], dict[str, int]]) -> list[Observation]:
        self.record_waits()
        with _mutex:
            counted = [(cell, list(counts_of(cell).items())) for cell in self.cells.values()]
        return [
            Observation(n, cell.with_(name, key)) for cell, counts in counted for key, n in counts
        ]

    def observe_acquisitions(self, options: CallbackOptions) -> Iterable[Observation]:
        return self.by("lock.outcome", lambda cell: {k: o.count for k, o in cell.outcomes.items()})

    def observe_lost(self, options: CallbackOptions) -> Iterable[Observation]:
        return self.by("lock.detected_by", lambda cell: cell.lost)

    def observe_skipped(self, options: CallbackOptions) -> Iterable[Observation]:
        return self.by("lock.skip_code", lambda cell: cell.skipped)

    def observe_held(self, options: CallbackOptions) -> Iterable[Observation]:
        self.record_waits()
        with _mutex:
            return [Observation(cell.held, cell.attributes) for cell in self.cells.values()]

    def observe_owner_leases(self, options: CallbackOptions) -> Iterable[Observation]:
        self.record_waits()
        with _mutex:
            cells = self.cells.values()
            return [Observation(cell.owner, cell.attributes) for cell in cells if cell.owns]

    def observe_leaders(self, options: CallbackOptions) -> Iterable[Observation]:
        self.record_waits()
        with _mutex:
            return [
                Observation(leading, attributes) for leading, attributes in self.leaders.values()
            ]


use()
