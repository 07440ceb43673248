"""The Prometheus exporter in multiprocess mode: prometheus_client's metrics, updated per event."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

if TYPE_CHECKING:
    from django_locks.contrib.prometheus import Families, Family
    from django_locks.events import Event

M = TypeVar("M", bound=MetricWrapperBase)

_Acquired = tuple[Histogram, Counter, Gauge, Gauge | None]
_Ended = tuple[Gauge, Gauge | None]


def _metric(family: Family, registry: CollectorRegistry | None) -> Any:
    if family.type == "histogram":
        return Histogram(
            family.name, family.help, family.labels, registry=registry, buckets=family.buckets
        )
    if family.type == "counter":
        return Counter(family.name, family.help, family.labels, registry=registry)
    return Gauge(
        family.name, family.help, family.labels, registry=registry, multiprocess_mode="livesum"
    )


class MetricsExporter:
    """The metrics of ``families`` as prometheus_client's metrics on ``registry``: in
    multiprocess mode each update is written to this process's file, which the
    ``MultiProcessCollector`` of a scrape reads with the other processes' (a collector of the
    exporter's own could only show this process's values)."""

    def __init__(self, families: Families, registry: CollectorRegistry | None) -> None:
        self.acquire_wait: Histogram = _metric(families.acquire_wait, registry)
        self.acquisitions: Counter = _metric(families.acquisitions, registry)
        self.held: Gauge = _metric(families.held, registry)
        self.lost: Counter = _metric(families.lost, registry)
        self.renewal: Histogram = _metric(families.renewal, registry)
        self.runs_skipped: Counter = _metric(families.runs_skipped, registry)
        self.leader: Gauge = _metric(families.leader, registry)
        self.owner_leases: Gauge = _metric(families.owner_leases, registry)
        # Labelled children by their label values: labels() costs about 0.6 us a call, a dict
        # lookup 0.05 us, and label values are bounded (events.label_of), so the caches are too.
        self._acquired: dict[tuple[str, str, str], _Acquired] = {}
        self._ended: dict[tuple[str, str, str], _Ended] = {}
        self._children: dict[MetricWrapperBase, dict[tuple[str, ...], Any]] = {}

    def consume(self, event: Event) -> None:
        """Update the metrics for ``event``."""
        kind = event.kind
        if kind == "acquired":
            found = self._acquired.get((event.label, event.store, event.use))
            if found is None:
                found = self._acquired_children(event)
            wait, count, held, owner = found
            wait.observe(event.duration or 0.0)
            count.inc()
            held.inc()
            if owner is not None:
                owner.inc()
        elif kind == "released" or kind == "lost":
            ended = self._ended.get((event.label, event.store, event.use))
            if ended is None:
                ended = self._ended_children(event)
            ended[0].dec()
            if ended[1] is not None:
                ended[1].dec()
            if kind == "lost":
                self._labelled(self.lost, event.label, event.store, event.outcome).inc()
        elif kind == "not_acquired":
            labels = (event.label, event.store, event.outcome)
            self._labelled(self.acquire_wait, *labels).observe(event.duration or 0.0)
            self._labelled(self.acquisitions, *labels).inc()
            if event.use == "leader":
                # A follower shows the election at 0, so that "no leader" is a sum of 0 over
                # the live replicas (an alert can fire on it), not a series that vanished.
                self._labelled(self.leader, event.label, event.store)
        elif kind == "renewed":
            renewal = self._labelled(self.renewal, event.store, event.outcome)
            renewal.observe(event.duration or 0.0)
        elif kind == "run_skipped":
            self._labelled(self.runs_skipped, event.label, event.store, event.outcome).inc()
        elif kind == "leadership_acquired" or kind == "leadership_lost":
            # set, not inc: this process leads an election or not, however often it is told.
            leader = self._labelled(self.leader, event.label, event.store)
            leader.set(1 if kind == "leadership_acquired" else 0)

    def _acquired_children(self, event: Event) -> _Acquired:
        label, store = event.label, event.store
        found = (
            self.acquire_wait.labels(label, store, "acquired"),
            self.acquisitions.labels(label, store, "acquired"),
            self.held.labels(label, store),
            self.owner_leases.labels(label, store) if event.use == "owner" else None,
        )
        return self._acquired.setdefault((label, store, event.use), found)

    def _ended_children(self, event: Event) -> _Ended:
        label, store = event.label, event.store
        found = (
            self.held.labels(label, store),
            self.owner_leases.labels(label, store) if event.use == "owner" else None,
        )
        return self._ended.setdefault((label, store, event.use), found)

    def _labelled(self, metric: M, *values: str) -> M:
        """``metric.labels(*values)``, made once."""
        children = self._children.get(metric)
        if children is None:
            children = self._children.setdefault(metric, {})
        child = children.get(values)
        if child is None:
            child = children.setdefault(values, metric.labels(*values))
        return cast("M", child)
