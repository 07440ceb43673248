"""The OpenTelemetry exporter against the real SDK: an in-memory metric reader and span exporter.

Each test gives the exporter providers of its own (``use()``: the API lets a process set its
global providers once), and turns it on as a project does, with ``LOCKS["METRICS"]``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from django_locks import (
    Lock,
    Locks,
    events,
    exporters,
    locks,
    on_one_instance,
    registry,
    without_overlapping,
)
from django_locks.abort import AbortSignal
from django_locks.contrib import opentelemetry as exporter
from django_locks.decorators import release_owner_leases
from django_locks.events import store_name
from django_locks.exceptions import LockNotAcquiredError, StoreError
from django_locks.leader import Campaign, _elections, leader_election
from django_locks.stores import InMemoryStore
from django_locks.stores.base import LockStore
from django_locks.testing import ManualClock
from tests.children.env import ROOT, child_env
from tests.helpers import FaultyStore, eventually

pytestmark = pytest.mark.usefixtures("locks_reset", "no_owner_leases")

Attributes = frozenset[tuple[str, Any]]


class Unreachable(LockStore):
    """A store whose every call fails, as one the network cannot reach."""

    def __str__(self) -> str:
        return "unreachable store"

    def acquire(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Any:
        raise StoreError("connection refused")

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> bool:
        raise StoreError("connection refused")

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        raise StoreError("connection refused")


@dataclasses.dataclass
class Telemetry:
    """The test's providers: what the exporter reported."""

    reader: InMemoryMetricReader
    spans: InMemorySpanExporter
    tracer_provider: TracerProvider

    def metrics(self) -> dict[str, Any]:
        """The django_locks meter's metrics, collected now, by name."""
        found = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                if scope.scope.name == exporter.NAME:
                    found.update({metric.name: metric for metric in scope.metrics})
        return found

    def points(self, name: str) -> dict[Attributes, Any]:
        """The points of ``name`` by their attributes: a value, or a histogram's point."""
        metric = self.metrics().get(name)
        if metric is None:
            return {}
        return {
            frozenset(point.attributes.items()): (
                point if isinstance(point, HistogramDataPoint) else point.value
            )
            for point in metric.data.data_points
        }

    def finished(self, name: str | None = None) -> list[Span]:
        """The spans ended so far (``name``'s only, when given), oldest first."""
        spans = [Span.of(span) for span in self.spans.get_finished_spans()]
        return [span for span in spans if name is None or span.name == name]


@dataclasses.dataclass(frozen=True)
class Span:
    """What a test reads of an ended span."""

    name: str
    attributes: dict[str, Any]
    start: int
    end: int
    trace_id: int
    parent_id: int | None
    status: StatusCode

    @classmethod
    def of(cls, span: ReadableSpan) -> Span:
        assert span.start_time is not None and span.end_time is not None
        assert span.context is not None
        return cls(
            span.name,
            dict(span.attributes or {}),
            span.start_time,
            span.end_time,
            span.context.trace_id,
            span.parent.span_id if span.parent is not None else None,
            span.status.status_code,
        )


def attrs(**values: Any) -> Attributes:
    """Attributes as the exporter names them: ``lock.<name>``."""
    return frozenset((f"lock.{name}", value) for name, value in values.items())


MEMORY = str(InMemoryStore())


@pytest.fixture
def no_owner_leases() -> Iterator[None]:
    release_owner_leases()
    yield
    release_owner_leases()


@pytest.fixture
def providers() -> Iterator[Telemetry]:
    """The exporter on providers of this test's (not turned on)."""
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    exporter.use(meter_provider, tracer_provider)
    yield Telemetry(reader, spans, tracer_provider)
    exporter.use()
    meter_provider.shutdown()
    tracer_provider.shutdown()


@pytest.fixture
def otel(providers: Telemetry) -> Iterator[Telemetry]:
    """The exporter turned on by ``LOCKS["METRICS"]``, on this test's providers."""
    with override_settings(LOCKS={**settings.LOCKS, "METRICS": ["opentelemetry"]}):
        assert exporters.active() == ["opentelemetry"]
        yield providers
    assert exporters.active() == []


def test_acquisitions_by_outcome_and_their_wait(otel: Telemetry) -> None:
    service = Locks(InMemoryStore())
    lock = service.acquire("orders:1")
    assert lock is not None
    assert service.acquire("orders:1", wait=0.05) is None  # taken, after waiting 50 ms
    with pytest.raises(StoreError):
        Locks(Unreachable()).acquire("orders:2")
    signal = AbortSignal()
    signal.abort()
    assert service.acquire("orders:1", wait=5, signal=signal) is None

    assert otel.points("django_locks.acquisitions") == {
        attrs(label="orders", store=MEMORY, outcome="acquired"): 1,
        attrs(label="orders", store=MEMORY, outcome="taken"): 1,
        attrs(label="orders", store=MEMORY, outcome="aborted"): 1,
        attrs(label="orders", store="unreachable store", outcome="error"): 1,
    }
    waits = otel.points("django_locks.acquire.duration")
    assert {key: point.count for key, point in waits.items()} == {
        attrs(label="orders", store=MEMORY, outcome="acquired"): 1,
        attrs(label="orders", store=MEMORY, outcome="taken"): 1,
        attrs(label="orders", store=MEMORY, outcome="aborted"): 1,
        attrs(label="orders", store="unreachable store", outcome="error"): 1,
    }
    taken = waits[attrs(label="orders", store=MEMORY, outcome="taken")]
    assert 0.05 <= taken.sum < 5
    assert taken.explicit_bounds == exporter.WAIT_BUCKETS  # seconds, not the SDK's ms buckets
    metric = otel.metrics()["django_locks.acquire.duration"]
    assert metric.unit == "s"
    assert otel.metrics()["django_locks.acquisitions"].unit == "{acquisition}"
    # Cumulative: a second collection counts nothing twice.
    assert (
        otel.points("django_locks.acquire.duration")[
            attrs(label="orders", store=MEMORY, outcome="taken")
        ].count
        == 1
    )
    lock.release()


def test_the_held_gauge_goes_up_and_down(otel: Telemetry) -> None:
    service = Locks(InMemoryStore())
    held = attrs(label="orders", store=MEMORY)
    first = service.acquire("orders:1")
    second = service.acquire("orders:2")
    assert first is not None and second is not None
    assert otel.points("django_locks.held") == {held: 2}
    first.release()
    assert otel.points("django_locks.held") == {held: 1}
    with service.lock("orders:3"):
        assert otel.points("django_locks.held") == {held: 2}
    second.release()
    assert otel.points("django_locks.held") == {held: 0}
    assert otel.metrics()["django_locks.held"].unit == "{lock}"


def test_a_forked_child_reports_none_of_its_parents_counts(otel: Telemetry) -> None:
    """Celery prefork and gunicorn fork workers: the parent's held locks are detached in the
    child, which must not report them held, nor export the parent's counters again."""
    import os

    service = Locks(InMemoryStore())
    lock = service.acquire("forked:1")
    assert lock is not None
    assert otel.points("django_locks.held") == {attrs(label="forked", store=MEMORY): 1}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what its own reader sees, then leave at once
        try:
            seen = {
                "held": sorted(otel.points("django_locks.held").values()),
                "acquisitions": sorted(otel.points("django_locks.acquisitions").values()),
            }
            os.write(write, json.dumps(seen).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        seen = json.loads(answer.read() or "{}")
    os.waitpid(pid, 0)
    assert seen == {"held": [], "acquisitions": []}
    assert otel.points("django_locks.held") == {attrs(label="forked", store=MEMORY): 1}
    lock.release()


def test_a_loss_past_the_deadline_counts_by_detected_by(otel: Telemetry) -> None:
    clock = ManualClock()
    store = FaultyStore(InMemoryStore(clock=clock))
    service = Locks(store, ttl="3s", clock=clock)
    lock = service.acquire("payouts:1")
    assert lock is not None
    store.failing.add("renew")  # the store is unreachable from here on
    clock.advance("4s")
    assert not lock.held
    where = "FaultyStore"
    assert otel.points("django_locks.lost") == {
        attrs(label="payouts", store=where, detected_by="deadline"): 1
    }
    assert otel.points("django_locks.held") == {attrs(label="payouts", store=where): 0}
    renewals = otel.points("django_locks.renewal.duration")
    assert renewals[attrs(store=where, outcome="error")].count >= 1


def test_a_refused_renewal_counts_as_lost_by_renewal(otel: Telemetry) -> None:
    clock = ManualClock()
    store = InMemoryStore(clock=clock)
    service = Locks(store, ttl="3s", clock=clock)
    lock = service.acquire("payouts:2")
    assert lock is not None
    store.clear()
    assert store.acquire("payouts:2", "another process", 3000) is not None
    clock.advance("1s")  # the renewal is refused: the key is someone else's
    assert not lock.held
    assert otel.points("django_locks.lost") == {
        attrs(label="payouts", store=MEMORY, detected_by="renewal"): 1
    }


def test_a_renewal_round_is_recorded(otel: Telemetry) -> None:
    clock = ManualClock()
    service = Locks(InMemoryStore(clock=clock), ttl="3s", clock=clock)
    lock = service.acquire("feeds:1")
    assert lock is not None
    assert otel.points("django_locks.renewal.duration") == {}
    clock.advance("1s")  # ttl / 3: one renewal round
    renewals = otel.points("django_locks.renewal.duration")
    assert {key: point.count for key, point in renewals.items()} == {
        attrs(store=MEMORY, outcome="renewed"): 1
    }
    assert otel.metrics()["django_locks.renewal.duration"].unit == "s"
    lock.release()


@without_overlapping("report:{n}", ttl="30s")
def report(n: int) -> int:
    return n


@on_one_instance("metrics:nightly", ttl="30s")
def nightly() -> str:
    return "ran"


def test_skipped_runs_count_by_code(otel: Telemetry) -> None:
    holding = locks.acquire("report:1")  # a run of report(1) in progress
    assert holding is not None
    assert report(1) is None
    holding.release()
    assert locks.store.acquire("metrics:nightly:owner", "another instance", 60_000) is not None
    assert nightly() is None
    default = store_name(locks.store)
    assert otel.points("django_locks.run.skipped") == {
        attrs(label="report:{n}", store=default, skip_code="in_progress"): 1,
        attrs(label="metrics:nightly", store=default, skip_code="elsewhere"): 1,
    }
    assert otel.metrics()["django_locks.run.skipped"].unit == "{run}"


def test_the_owner_lease_gauge(otel: Telemetry) -> None:
    default = store_name(locks.store)
    assert nightly() == "ran"  # the owner lease stays this instance's after the run
    leases = attrs(label="metrics:nightly", store=default)
    assert otel.points("django_locks.owner_lease.count") == {leases: 1}
    assert otel.points("django_locks.held")[leases] == 1
    release_owner_leases()
    assert otel.points("django_locks.owner_lease.count") == {leases: 0}
    assert otel.metrics()["django_locks.owner_lease.count"].unit == "{lease}"
    # Locks that are not owner leases never show in it.
    with locks.lock("other:1"):
        assert set(otel.points("django_locks.owner_lease.count")) == {leases}


def test_the_leader_gauge_of_an_election(otel: Telemetry) -> None:
    key = "metrics:leader"
    leading = threading.Event()

    def lead(lock: Lock) -> None:
        leading.set()
        lock.signal.wait()

    leader_election(key)(lead)
    election = _elections[key]
    stopping = threading.Event()
    campaign = Campaign(
        election,
        Locks(InMemoryStore(), ttl=1),
        ttl_ms=1000,
        grace=2.0,
        stopping=stopping,
        report=lambda line, level: None,
    )
    thread = threading.Thread(target=campaign.run)
    thread.start()
    try:
        assert leading.wait(10)
        expected = frozenset({("lock.election", key), ("lock.store", MEMORY)})
        eventually(lambda: otel.points("django_locks.leader") == {expected: 1}, what="leading")
        stopping.set()
        campaign.wake.set()
        thread.join(10)
        assert otel.points("django_locks.leader") == {expected: 0}
    finally:
        stopping.set()
        campaign.wake.set()
        thread.join(10)
        _elections.pop(key, None)
        registry.unclaim(registry.job_for(election.target, kind="", key=key))
    assert otel.metrics()["django_locks.leader"].unit == "{leader}"
    assert not [s for s in otel.finished() if s.attributes.get("lock.label") == key]


def test_spans_of_a_lock_block_are_children_of_the_current_span(otel: Telemetry) -> None:
    service = Locks(InMemoryStore())
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("request") as parent:
        with service.lock("orders:7") as lock:
            time.sleep(0.02)
    acquire, hold = otel.finished("lock.acquire"), otel.finished("lock.hold")
    assert len(acquire) == 1 and len(hold) == 1
    request = otel.finished("request")[0]
    for span in (acquire[0], hold[0]):
        assert span.parent_id == parent.get_span_context().span_id
        assert span.trace_id == parent.get_span_context().trace_id
        assert span.status is StatusCode.UNSET
        assert span.attributes == {
            "lock.label": "orders",
            "lock.store": MEMORY,
            "lock.key": "orders:7",
            "lock.fencing_token": lock.fencing_token,
            "lock.outcome": "acquired" if span is acquire[0] else "released",
        }
        assert request.start <= span.start <= span.end <= request.end
    # The hold began when the acquire ended, and lasted the block.
    assert abs(hold[0].start - acquire[0].end) < 5_000_000
    assert hold[0].end - hold[0].start >= 20_000_000


def test_spans_of_with_lock_and_of_a_decorated_run(otel: Telemetry) -> None:
    Locks(InMemoryStore()).with_lock("orders:8", lambda: None)
    assert report(5) == 5
    keys = [(span.name, span.attributes["lock.key"]) for span in otel.finished()]
    assert keys == [
        ("lock.acquire", "orders:8"),
        ("lock.hold", "orders:8"),
        ("lock.acquire", "report:5"),
        ("lock.hold", "report:5"),
    ]
    assert otel.finished()[-1].attributes["lock.label"] == "report:{n}"


def test_an_acquire_that_failed_has_its_span_and_an_error_one_the_error_status(
    otel: Telemetry,
) -> None:
    service = Locks(InMemoryStore())
    with service.lock("orders:9"):
        with pytest.raises(LockNotAcquiredError), service.lock("orders:9"):
            pass
    with pytest.raises(StoreError), Locks(Unreachable()).lock("orders:10"):
        pass
    failed = [
        span
        for span in otel.finished("lock.acquire")
        if span.attributes["lock.outcome"] != "acquired"
    ]
    assert [(s.attributes["lock.outcome"], s.status) for s in failed] == [
        ("taken", StatusCode.UNSET),
        ("error", StatusCode.ERROR),
    ]
    assert "lock.fencing_token" not in failed[0].attributes


def test_a_lost_lock_ends_its_hold_span_in_error(otel: Telemetry) -> None:
    clock = ManualClock()
    store = InMemoryStore(clock=clock)
    service = Locks(store, ttl="3s", clock=clock)
    with service.lock("payouts:3") as lock:
        store.clear()
        assert store.acquire("payouts:3", "another process", 3000) is not None
        clock.advance("1s")
        assert not lock.held
    (hold,) = otel.finished("lock.hold")
    assert hold.attributes["lock.outcome"] == "lost"
    assert hold.attributes["lock.detected_by"] == "renewal"
    assert hold.status is StatusCode.ERROR


def test_no_span_for_acquire_owner_leases_or_leaderships(otel: Telemetry) -> None:
    lock = Locks(InMemoryStore()).acquire("orders:11")
    assert lock is not None
    lock.release()
    assert nightly() == "ran"
    release_owner_leases()
    assert otel.finished() == []
    assert otel.points("django_locks.acquisitions")  # counted all the same


def test_ten_thousand_keys_of_one_template_are_one_label_value(otel: Telemetry) -> None:
    for n in range(10_000):
        assert report(n) == n
    # Another process runs report(1): this one's run is skipped.
    assert locks.store.acquire("report:1", "another process", 60_000) is not None
    assert report(1) is None
    default = store_name(locks.store)
    labels: dict[str, set[Any]] = {}
    for name, metric in otel.metrics().items():
        labels[name] = {dict(p.attributes).get("lock.label") for p in metric.data.data_points}
    assert labels == {
        "django_locks.acquire.duration": {"report:{n}"},
        "django_locks.acquisitions": {"report:{n}"},
        "django_locks.held": {"report:{n}"},
        "django_locks.run.skipped": {"report:{n}"},
    }
    acquisitions = otel.points("django_locks.acquisitions")
    assert acquisitions == {
        attrs(label="report:{n}", store=default, outcome="acquired"): 10_000,
        attrs(label="report:{n}", store=default, outcome="taken"): 1,
    }
    # Spans are not aggregated: they carry the rendered key.
    assert len({span.attributes["lock.key"] for span in otel.finished()}) == 10_000


def test_the_setting_turns_it_on_and_off(providers: Telemetry) -> None:
    service = Locks(InMemoryStore())
    with override_settings(LOCKS={**settings.LOCKS, "METRICS": []}):
        assert "opentelemetry" not in exporters.active()
        service.acquire("off:1")
    assert providers.points("django_locks.acquisitions") == {}
    with override_settings(LOCKS={**settings.LOCKS, "METRICS": ["opentelemetry"]}):
        assert "opentelemetry" in exporters.active()
        service.acquire("on:1")
    assert exporters.active() == []
    service.acquire("off:2")
    assert providers.points("django_locks.acquisitions") == {
        attrs(label="on", store=MEMORY, outcome="acquired"): 1
    }


def test_waits_are_kept_for_the_next_collection_within_a_bound(
    providers: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exporter, "RECORD_AT", 3)
    unsubscribe = events.subscribe(exporter.consume)
    try:
        service = Locks(InMemoryStore())
        for n in range(7):
            service.acquire(f"bounded:{n}")
        kept = [
            len(outcome.waits)
            for cell in exporter._cells.values()
            for outcome in cell.outcomes.values()
        ]
        assert kept == [1]  # 6 recorded as the bound was reached, 1 kept
        waits = providers.points("django_locks.acquire.duration")
        assert [point.count for point in waits.values()] == [7]
    finally:
        unsubscribe()


def test_a_missing_library_names_the_extra() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tests.children.metrics_startup", "missing", "opentelemetry"],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert out.stdout.startswith("ImproperlyConfigured"), out.stdout + out.stderr
    assert 'pip install "django-distributed-locks[opentelemetry]"' in out.stdout
    assert "opentelemetry-api is not installed" in out.stdout


def test_with_metrics_off_nothing_of_it_is_imported() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tests.children.metrics_startup", "off"],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_an_sdk_set_up_after_startup_gets_the_metrics_and_spans() -> None:
    # A gunicorn worker sets the SDK up in post_fork, after django.setup() made the instruments.
    out = subprocess.run(
        [sys.executable, "-m", "tests.children.metrics_startup", "late-sdk"],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "metrics": [
            "django_locks.acquire.duration",
            "django_locks.acquisitions",
            "django_locks.held",
        ],
        "spans": ["lock.acquire", "lock.hold"],
    }


def test_use_counts_afresh_and_the_previous_providers_keep_their_counts(otel: Telemetry) -> None:
    service = Locks(InMemoryStore())
    lock = service.acquire("orders:1")
    assert lock is not None
    reader = InMemoryMetricReader()
    exporter.use(MeterProvider(metric_readers=[reader]))
    again = Telemetry(reader, otel.spans, otel.tracer_provider)
    service.acquire("invoices:1")
    acquired = {"outcome": "acquired"}
    assert again.points("django_locks.acquisitions") == {
        attrs(label="invoices", store=MEMORY, **acquired): 1
    }
    assert otel.points("django_locks.acquisitions") == {
        attrs(label="orders", store=MEMORY, **acquired): 1
    }
    assert [point.count for point in otel.points("django_locks.acquire.duration").values()] == [1]
    lock.release()
