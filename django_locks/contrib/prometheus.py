"""The Prometheus exporter of ``LOCKS["METRICS"] = ["prometheus"]``: the event stream as metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from prometheus_client import REGISTRY, CollectorRegistry, values

from django_locks import process  # noqa: F401 (its at-fork hook resets the counts: see there)
from django_locks.contrib.prometheus_counts import CountsExporter
from django_locks.contrib.prometheus_multiprocess import MetricsExporter

if TYPE_CHECKING:
    from collections.abc import Callable

    from django_locks.events import Event

__all__ = ["RENEWAL_BUCKETS", "WAIT_BUCKETS", "PrometheusExporter", "consume", "exporter"]

WAIT_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
)  # fmt: skip
"""The buckets of ``django_locks_acquire_wait_seconds`` (seconds; ``+Inf`` is added): a free key
answers in one round trip (under a millisecond on Redis, a few on a database), a waited one in up
to ``wait``."""

RENEWAL_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""The buckets of ``django_locks_renewal_seconds`` (seconds; ``+Inf`` is added): one round trip
renewing every lock of a store, which must stay well under a third of the shortest ttl."""


class Family(NamedTuple):
    """One exported metric: both ways of keeping its values make it from this alone."""

    name: str
    type: str
    """``histogram``, ``counter`` or ``gauge`` (the gauges are ``livesum`` in multiprocess mode)."""
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()


class Families(NamedTuple):
    """Every metric, in the order a scrape shows them."""

    acquire_wait: Family
    acquisitions: Family
    held: Family
    lost: Family
    renewal: Family
    runs_skipped: Family
    leader: Family
    owner_leases: Family


_LOCK_STORE = ("lock", "store")
FAMILIES = Families(
    acquire_wait=Family(
        "django_locks_acquire_wait_seconds",
        "histogram",
        "How long acquires waited, acquired or not (outcome: acquired, taken, aborted, error).",
        (*_LOCK_STORE, "outcome"),
        WAIT_BUCKETS,
    ),
    acquisitions=Family(
        "django_locks_acquisitions_total",
        "counter",
        "Acquires by outcome: acquired, taken, aborted, error.",
        (*_LOCK_STORE, "outcome"),
    ),
    held=Family(
        "django_locks_held",
        "gauge",
        "Locks held now (every use: locks, runs, owner leases, leaderships).",
        _LOCK_STORE,
    ),
    lost=Family(
        "django_locks_lost_total",
        "counter",
        "Locks lost while held, by what detected the loss.",
        (*_LOCK_STORE, "detected_by"),
    ),
    renewal=Family(
        "django_locks_renewal_seconds",
        "histogram",
        "Renewal round trips (each renews every lock of a store): renewed, refused, error.",
        ("store", "outcome"),
        RENEWAL_BUCKETS,
    ),
    runs_skipped=Family(
        "django_locks_runs_skipped_total",
        "counter",
        "Decorated runs skipped, by code: elsewhere, in_progress, at_capacity, not_replaced, "
        "missed, duplicate.",
        (*_LOCK_STORE, "code"),
    ),
    leader=Family(
        "django_locks_leader",
        "gauge",
        "1 where this process leads the election (summed: how many leaders it has).",
        ("election", "store"),
    ),
    owner_leases=Family(
        "django_locks_owner_leases",
        "gauge",
        "Owner leases held now (on_one_instance, the Celery beat guard).",
        _LOCK_STORE,
    ),
)
"""The metrics' names, types, help and labels: docs/topics/metrics.rst's table."""


class PrometheusExporter:
    """The lock metrics on ``registry`` and :attr:`consume`, the event consumer that updates them.

    The module makes one at import, on prometheus_client's default ``REGISTRY``
    (:data:`exporter`); make another on a ``CollectorRegistry`` of your own (a test's) and
    subscribe its ``consume`` with ``django_locks.events.subscribe``. In one process the values
    are plain numbers the exporter keeps, read by a collector it registers on ``registry`` at
    each scrape. In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client
    is imported) they are prometheus_client's metrics, whose values live in that directory, and
    the gauges sum over the live processes (``livesum``).
    """

    consume: Callable[[Event], None]
    """Update the metrics for ``event``: the consumer to subscribe."""

    multiprocess: bool
    """Whether the values are prometheus_client's multiprocess files (see above)."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        # prometheus_client chose where values live when it was imported: MutexValue in one
        # process, else a class writing each value to the process's file (multiprocess mode),
        # which only its own metrics write and its MultiProcessCollector sums over processes.
        self.multiprocess = values.ValueClass is not values.MutexValue
        if self.multiprocess:
            self.consume = MetricsExporter(FAMILIES, registry).consume
            self._counts: CountsExporter | None = None
        else:
            self._counts = CountsExporter(FAMILIES, registry)
            self.consume = self._counts.consume

    def forget_in_child(self) -> None:
        """After fork(), in the child: forget the parent's numbers (one process's mode only:
        prometheus_client keeps each process's multiprocess values in files of its pid)."""
        if self._counts is not None:
            self._counts.forget_in_child()


exporter = PrometheusExporter()
"""The exporter ``LOCKS["METRICS"] = ["prometheus"]`` subscribes: its metrics are on
prometheus_client's default ``REGISTRY``, made when this module is first imported."""

consume = exporter.consume
"""The module's consumer (``django_locks.exporters`` subscribes it): :data:`exporter`'s."""


def forget_counts_in_child() -> None:
    """After fork(), in the child (``django_locks.process.AFTER_FORK``): :data:`exporter`'s
    numbers forgotten (an exporter a test made is the test's)."""
    exporter.forget_in_child()
