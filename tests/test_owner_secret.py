"""The owner id is the holder's secret (SPEC section 2): every surface people read, collected for
a held lease on each server store, and searched for it.

The surfaces: the admin's pages (the listing, filtered and searched, and the release
confirmation), ``manage.py locks`` (list, list --all, list --json, release and its audit line),
``LockNotAcquiredError`` (its message, its repr, its holder), ``repr()`` of the lock, the log
records of every logger at DEBUG (the skip lines naming the holder, the loss, the release), and
the keyword arguments of the package's signals, and the metrics and traces: the Prometheus
exporter's scrape and the OpenTelemetry exporter's metrics and spans.
"""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from django_locks import LockNotAcquiredError, without_overlapping
from django_locks import signals as lock_signals
from django_locks.service import locks
from django_locks.stores.base import LockStore
from tests.helpers import eventually

pytestmark = pytest.mark.django_db(transaction=True)
ON_POSTGRES = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "postgres"]),
]


def configure(settings: Any, backend: str, options: dict[str, Any]) -> Iterator[LockStore]:
    settings.LOCKS = {"BACKEND": backend, "OPTIONS": options, "TTL": "2s"}
    store = locks.store
    store.clear()
    yield store
    store.clear()
    store.close()


@pytest.fixture
def pg_store(settings: Any) -> Iterator[LockStore]:
    yield from configure(settings, "django_locks.stores.DatabaseStore", {"using": "postgres"})


@pytest.fixture
def redis_store(settings: Any, redis_server: Any) -> Iterator[LockStore]:
    yield from configure(settings, "django_locks.stores.RedisStore", {"url": redis_server.url})


@pytest.fixture(
    params=[
        pytest.param("pg_store", marks=ON_POSTGRES),
        pytest.param("redis_store", marks=pytest.mark.redis),
    ]
)
def store(request: pytest.FixtureRequest) -> LockStore:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def command(*args: str, stdin: str | None = None) -> str:
    out, err = io.StringIO(), io.StringIO()
    options: dict[str, Any] = {"stdout": out, "stderr": err}
    if stdin is not None:
        options["stdin"] = io.StringIO(stdin)
    call_command("locks", *args, **options)
    return out.getvalue() + err.getvalue()


class Exporters:
    """Both exporters, on registries and providers of the test's own, subscribed to the event
    stream until ``close()``; calling it scrapes them."""

    def __init__(self) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from prometheus_client import CollectorRegistry

        from django_locks import events
        from django_locks.contrib import opentelemetry as otel
        from django_locks.contrib.prometheus import PrometheusExporter

        self.registry = CollectorRegistry()
        self.reader = InMemoryMetricReader()
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        otel.use(MeterProvider(metric_readers=[self.reader]), tracer_provider)
        self.unsubscribe = [
            events.subscribe(PrometheusExporter(self.registry).consume),
            events.subscribe(otel.consume),
            otel.use,  # back to the global providers
        ]

    def __call__(self) -> dict[str, str]:
        from prometheus_client import generate_latest

        metrics = self.reader.get_metrics_data()
        spans = self.spans.get_finished_spans()
        assert spans, "the lock() block's spans"
        return {
            "prometheus scrape": generate_latest(self.registry).decode(),
            "opentelemetry metrics": metrics.to_json() if metrics is not None else "",
            "opentelemetry spans": "\n".join(span.to_json() for span in spans),
        }

    def close(self) -> None:
        for unsubscribe in self.unsubscribe:
            unsubscribe()


@without_overlapping("secret:{name}")
def report(name: str) -> str:
    return "ran"


def test_no_surface_shows_the_owner_id(
    store: LockStore, client: Client, django_user_model: Any, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    name = uuid.uuid4().hex[:8]
    key = f"secret:{name}"
    sent: list[str] = []

    def receiver(signal: Any, sender: Any, **kwargs: Any) -> None:
        sent.append(repr(kwargs))

    connected = [lock_signals.run_skipped, lock_signals.lock_lost]
    for signal in connected:
        signal.connect(receiver, weak=False)
    scrapes = Exporters()
    try:
        lock = locks.acquire(key)
        assert lock is not None
        owner = lock.owner
        surfaces: dict[str, str] = {"repr(lock)": repr(lock)}

        with pytest.raises(LockNotAcquiredError) as refused:
            with locks.lock(key):
                pass
        error = refused.value
        assert error.holder is not None, "the store names the holder in the same round trip"
        surfaces["error"] = f"{error}\n{error!r}\n{error.holder!r}\n{error.holder.describe()}"
        assert report(name) is None  # skipped: the skip line names the holder

        admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
        client.force_login(admin)
        url = "/admin/django_locks/lease/"
        for query in ("", "?state=held", f"?q={name}", "?o=1"):
            response = client.get(url + query)
            assert response.status_code == 200, query
            surfaces[f"admin{query}"] = response.content.decode()
        confirm = client.post(
            url, {"action": "release_selected", "_selected_action": [key], "index": "0"}
        )
        surfaces["admin confirmation"] = confirm.content.decode()

        surfaces["locks list"] = command("list")
        surfaces["locks list --all"] = command("list", "--all")
        surfaces["locks list --json"] = command("list", "--json", "--all")
        surfaces["locks release"] = command("release", key, stdin="y\n")
        # Released by hand: the holder learns it at its next renewal, and says so.
        eventually(lambda: not lock.held, what="the holder to notice the release")
        eventually(lambda: len(sent) >= 2, what="run_skipped and lock_lost")
        surfaces["signals"] = "\n".join(sent)
        surfaces["logs"] = "\n".join(
            f"{record.name} {record.levelname} {record.getMessage()}" for record in caplog.records
        )
        surfaces.update(scrapes())
    finally:
        for signal in connected:
            signal.disconnect(receiver)
        scrapes.close()

    # The owner id whole, and the random prefix every owner id of this process shares (a
    # surface showing a truncated id would still give it away).
    for secret in (owner, owner[:16]):
        shown = [where for where, text in surfaces.items() if secret in text]
        assert not shown, f"the owner id {secret!r} shows in {shown}"
    assert "held by" in surfaces["error"] and "pid" in surfaces["error"]
    assert "pid" in surfaces["locks list"], "people see the holder instead"
    assert "held by" in surfaces["logs"], "the skip line names the holder"
    # The metrics label the job by its template; the spans name the key.
    assert 'lock="secret:{name}"' in surfaces["prometheus scrape"]
    assert key in surfaces["opentelemetry spans"]
