"""Turning on the metrics exporters ``LOCKS["METRICS"]`` names: each an optional extra, imported
only when named (with ``LOCKS["METRICS"] = []``, neither library nor exporter module is)."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_locks import events

MODULES = {
    "opentelemetry": ("django_locks.contrib.opentelemetry", "opentelemetry-api", "opentelemetry"),
    "prometheus": ("django_locks.contrib.prometheus", "prometheus-client", "prometheus_client"),
}
"""Each exporter's module, the distribution it needs, and that distribution's import name."""

_on: dict[str, Callable[[], None]] = {}  # exporter name -> its unsubscribe
_mutex = threading.Lock()


def configure(names: Sequence[str]) -> None:
    """Subscribe the exporters ``names`` to the event stream, and unsubscribe the others (run
    from ``ready()`` and again when ``override_settings`` changes ``LOCKS``). Raises
    ``ImproperlyConfigured`` naming the extra to install when a library is missing."""
    with _mutex:
        for name in [name for name in _on if name not in names]:
            _on.pop(name)()
        for name in names:
            if name not in _on:
                _on[name] = events.subscribe(_load(name).consume)


def _load(name: str) -> Any:
    module, distribution, top = MODULES[name]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == top:
            raise ImproperlyConfigured(
                f"LOCKS['METRICS'] names {name!r}, but {distribution} is not installed: "
                f'pip install "django-distributed-locks[{name}]" (or remove {name!r} from '
                "LOCKS['METRICS'])."
            ) from exc
        raise


def active() -> list[str]:
    """The exporters turned on in this process."""
    return list(_on)
