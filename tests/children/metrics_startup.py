"""A fresh process started with ``LOCKS["METRICS"]``: what it imported, or why it refused to start.

``python -m tests.children.metrics_startup off`` starts with ``METRICS = []``, takes and releases
a lock and prints, as JSON, the modules it imported of the exporters and their libraries
(``django_locks.exporters.MODULES``; ``[]``: none). ``... metrics_startup missing NAME`` starts
with ``METRICS = [NAME]`` once NAME's library cannot be imported (``sys.modules[top] = None``:
importing it raises ``ModuleNotFoundError``, as without the extra) and prints the exception's
class name and message, or ``started``. ``... metrics_startup late-sdk`` starts with ``METRICS =
["opentelemetry"]``, sets OpenTelemetry's SDK as the global providers only then (as a gunicorn
worker's ``post_fork`` would), runs a ``lock()`` block and prints, as JSON, the metrics and spans
the SDK got.
"""

from __future__ import annotations

import json
import sys

from tests.children import startup


def configure(metrics: list[str]) -> None:
    from django.conf import settings

    settings.configure(
        DEBUG=True,
        INSTALLED_APPS=["django_locks"],
        LOCKS={"BACKEND": "django_locks.stores.InMemoryStore", "METRICS": metrics},
    )


def off() -> None:
    import django

    configure([])
    django.setup()
    from django_locks import locks
    from django_locks.exporters import MODULES

    with locks.lock("metrics:off"):
        pass
    tops = [top for module, _extra, library in MODULES.values() for top in (module, library)]
    imported = sorted(
        name for name in sys.modules if any(name == t or name.startswith(t + ".") for t in tops)
    )
    print(json.dumps(imported))


def missing(name: str) -> None:
    from django_locks.exporters import MODULES

    sys.modules[MODULES[name][2]] = None  # type: ignore[assignment]
    configure([name])
    startup.report()


def late_sdk() -> None:
    import django
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    configure(["opentelemetry"])
    django.setup()
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(tracer_provider)
    from django_locks import locks

    with locks.lock("metrics:late"):
        pass
    data = reader.get_metrics_data()
    names = sorted(
        metric.name
        for resource in (data.resource_metrics if data is not None else ())
        for scope in resource.scope_metrics
        for metric in scope.metrics
    )
    print(json.dumps({"metrics": names, "spans": [s.name for s in spans.get_finished_spans()]}))


def main() -> None:
    if sys.argv[1:] == ["off"]:
        off()
    elif sys.argv[1:] == ["late-sdk"]:
        late_sdk()
    elif len(sys.argv) == 3 and sys.argv[1] == "missing":
        missing(sys.argv[2])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} off | missing NAME | late-sdk")


if __name__ == "__main__":
    main()
