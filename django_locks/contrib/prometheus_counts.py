"""The Prometheus exporter in one process: plain counts under one mutex, read at each scrape."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from itertools import accumulate
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, metrics
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import INF, floatToGoString

if TYPE_CHECKING:
    from django_locks.contrib.prometheus import Families, Family
    from django_locks.events import Event

_Row = tuple[tuple[str, ...], float, list[int], float]  # labels, value, counts, created


class _Series:
    """One labelled series: a counter's or gauge's ``value``, or a histogram's sum (``value``)
    and observations per bucket (``counts``, not cumulative); ``created``, the time it was made,
    is the ``_created`` sample of counters and histograms, as prometheus_client's children show.
    Changed under the exporter's mutex only."""

    __slots__ = ("counts", "created", "value")

    def __init__(self, buckets: int) -> None:
        self.value = 0.0
        self.counts = [0] * buckets
        self.created = time.time()


class CountsExporter:
    """The metrics of ``families`` as numbers of the exporter's, which :meth:`collect` turns into
    metric families at each scrape of ``registry`` (it registers itself there as a collector).

    prometheus_client's metrics cost about 2 us per acquire + release in one process: four
    children updated, each under a lock of its own, a histogram's buckets searched in Python.
    Here the pair is two dict lookups, a ``bisect`` and a few additions under one mutex, taken
    twice; a scrape copies the numbers under it, so it reads each series whole. The values and
    the scrape's text are prometheus_client's (``tests/test_metrics_prometheus.py`` compares
    them), ``_created`` times included unless prometheus_client's are turned off.
    """

    def __init__(self, families: Families, registry: CollectorRegistry | None) -> None:
        self._families = families
        # One mutex for every series, not the GIL: "value += 1" is a load, an add and a store,
        # which Python does not promise to run unbroken (a free-threaded build runs them in
        # parallel), and a scrape must not copy a dict while a series is added to it.
        self._mutex = threading.Lock()
        # The series of each family by their label values, in the order they were made (the
        # order of a scrape, as prometheus_client's children); added to under the mutex only.
        self._series: dict[str, dict[tuple[str, ...], _Series]] = {f.name: {} for f in families}
        # Each histogram's upper bounds, +Inf last, and their le labels as prometheus_client
        # spells them (its floatToGoString is untyped).
        self._bounds = {f.name: (*f.buckets, INF) for f in families if f.type == "histogram"}
        self._les: dict[str, list[str]] = {
            name: [floatToGoString(b) for b in bounds]  # type: ignore[no-untyped-call]
            for name, bounds in self._bounds.items()
        }
        self._wait_bounds = self._bounds[families.acquire_wait.name]
        # The series an acquired or an ended lock changes, by (label, store, use): its acquire
        # wait (outcome "acquired"), the held gauge, the owner-lease gauge for use "owner".
        self._acquired: dict[tuple[str, str, str], tuple[_Series, _Series, _Series | None]] = {}
        self._ended: dict[tuple[str, str, str], tuple[_Series, _Series | None]] = {}
        if registry is not None:
            registry.register(self)

    def forget_in_child(self) -> None:
        """After fork(), in the child: the parent's numbers are not the child's (its locks were
        detached, and its counters would be exported twice); the mutex is made afresh, as
        another thread may have held it at fork() time. The series go, the registration stays."""
        self._mutex = threading.Lock()
        for series in self._series.values():
            series.clear()
        self._acquired.clear()
        self._ended.clear()

    def consume(self, event: Event) -> None:
        """Update the counts for ``event``."""
        kind = event.kind
        if kind == "acquired":
            cell = self._acquired.get((event.label, event.store, event.use))
            if cell is None:
                cell = self._acquired_cell(event)
            wait, held, owner = cell
            duration = event.duration or 0.0
            # The first bound at or above the wait: prometheus_client's observe() counts it there.
            bucket = bisect_left(self._wait_bounds, duration)
            # acquire() and release(), not "with": 60 ns against 110 ns, taken twice a pair.
            mutex = self._mutex
            mutex.acquire()
            try:
                wait.counts[bucket] += 1
                wait.value += duration
                held.value += 1
                if owner is not None:
                    owner.value += 1
            finally:
                mutex.release()
        elif kind == "released" or kind == "lost":
            ended = self._ended.get((event.label, event.store, event.use))
            if ended is None:
                ended = self._ended_cell(event)
            held, owner = ended
            lost = None
            if kind == "lost":
                lost = self._get(self._families.lost, (event.label, event.store, event.outcome))
            mutex = self._mutex
            mutex.acquire()
            try:
                held.value -= 1
                if owner is not None:
                    owner.value -= 1
                if lost is not None:
                    lost.value += 1
            finally:
                mutex.release()
        elif kind == "not_acquired":
            labels = (event.label, event.store, event.outcome)
            self._observe(self._families.acquire_wait, labels, event.duration)
            if event.use == "leader":
                # A follower shows the election at 0, so that "no leader" is a sum of 0 over
                # the live replicas (an alert can fire on it), not a series that vanished.
                self._get(self._families.leader, (event.label, event.store))
        elif kind == "renewed":
            self._observe(self._families.renewal, (event.store, event.outcome), event.duration)
        elif kind == "run_skipped":
            skipped = self._get(
                self._families.runs_skipped, (event.label, event.store, event.outcome)
            )
            with self._mutex:
                skipped.value += 1
        elif kind == "leadership_acquired" or kind == "leadership_lost":
            # set, not add: this process leads an election or not, however often it is told.
            leader = self._get(self._families.leader, (event.label, event.store))
            with self._mutex:
                leader.value = 1.0 if kind == "leadership_acquired" else 0.0

    def _observe(self, family: Family, labels: tuple[str, ...], duration: float | None) -> None:
        series = self._get(family, labels)
        duration = duration or 0.0
        bucket = bisect_left(self._bounds[family.name], duration)
        with self._mutex:
            series.counts[bucket] += 1
            series.value += duration

    def _get(self, family: Family, labels: tuple[str, ...]) -> _Series:
        """The series of ``family`` with ``labels``, made on the first call."""
        series = self._series[family.name].get(labels)
        if series is None:
            with self._mutex:
                buckets = len(self._bounds.get(family.name, ()))
                series = self._series[family.name].setdefault(labels, _Series(buckets))
        return series

    def _acquired_cell(self, event: Event) -> tuple[_Series, _Series, _Series | None]:
        families, label, store = self._families, event.label, event.store
        cell = (
            self._get(families.acquire_wait, (label, store, "acquired")),
            self._get(families.held, (label, store)),
            self._get(families.owner_leases, (label, store)) if event.use == "owner" else None,
        )
        return self._acquired.setdefault((label, store, event.use), cell)

    def _ended_cell(self, event: Event) -> tuple[_Series, _Series | None]:
        families, label, store = self._families, event.label, event.store
        cell = (
            self._get(families.held, (label, store)),
            self._get(families.owner_leases, (label, store)) if event.use == "owner" else None,
        )
        return self._ended.setdefault((label, store, event.use), cell)

    def describe(self) -> list[Metric]:
        """The families without samples: the names ``registry.register`` reserves for them."""
        return [self._metric(family, []) for family in self._families]

    def collect(self) -> list[Metric]:
        """Every family with its series, as prometheus_client's metrics would show them."""
        with self._mutex:
            rows: dict[str, list[_Row]] = {
                name: [(labels, s.value, list(s.counts), s.created) for labels, s in found.items()]
                for name, found in self._series.items()
            }
        # An acquire, acquired or not, is one acquisition and one acquire wait, and the two
        # series were made at the same event: the acquisitions are the waits' counts.
        families = self._families
        rows[families.acquisitions.name] = [
            (labels, float(sum(counts)), [], created)
            for labels, _sum, counts, created in rows[families.acquire_wait.name]
        ]
        return [self._metric(family, rows[family.name]) for family in families]

    def _metric(self, family: Family, rows: list[_Row]) -> Metric:
        # prometheus_client's own switch for _created samples (PROMETHEUS_DISABLE_CREATED_SERIES,
        # disable_created_metrics()), read at each scrape as its metrics read it.
        created = getattr(metrics, "_use_created", True)
        found: Metric
        if family.type == "histogram":
            found = histogram = HistogramMetricFamily(
                family.name, family.help, labels=family.labels
            )
            les = self._les[family.name]
            for labels, total, counts, made in rows:
                histogram.add_metric(labels, list(zip(les, accumulate(counts), strict=True)), total)
                if created:
                    histogram.add_sample(
                        family.name + "_created",
                        dict(zip(family.labels, labels, strict=True)),
                        made,
                    )
        elif family.type == "counter":
            found = counter = CounterMetricFamily(family.name, family.help, labels=family.labels)
            for labels, value, _counts, made in rows:
                counter.add_metric(labels, value, created=made if created else None)
        else:
            found = gauge = GaugeMetricFamily(family.name, family.help, labels=family.labels)
            for labels, value, _counts, _made in rows:
                gauge.add_metric(labels, value)
        return found
