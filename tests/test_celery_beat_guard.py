"""The beat-side guard in one process: a clean handover does not publish the same tick twice.

The scheduler here is a stand-in that records what beat would publish; the lock store is the real
in-memory one. The real beats and workers are in test_celery.py.
"""

from __future__ import annotations

import types
from typing import Any

from celery import Celery

from django_locks import on_one_instance
from django_locks.contrib.celery import HANDBACK_GRACE, HEADER_KEY, BeatGuard, _publishing
from tests.helpers import eventually

app = Celery("beat-guard-tests", set_as_current=False)


@app.task(name="beat_guard.export")  # type: ignore[untyped-decorator]
@on_one_instance(key="beat-guard:export")
def export() -> None: ...


def beat(published: list[tuple[str, dict[str, Any]]], name: str) -> BeatGuard:
    def apply_entry(entry: Any, producer: Any = None) -> None:
        published.append((name, dict(_publishing.get() or {})))

    scheduler = types.SimpleNamespace(app=app, apply_entry=apply_entry, close=lambda: None)
    return BeatGuard(scheduler)


def tick() -> Any:
    return types.SimpleNamespace(task="beat_guard.export", args=(), kwargs={})


def test_a_clean_handover_right_after_a_tick_does_not_publish_it_twice() -> None:
    app.finalize()
    published: list[tuple[str, dict[str, Any]]] = []
    first, second = beat(published, "first"), beat(published, "second")
    first.apply_entry(tick())  # the tick, published by the owner...
    second.apply_entry(tick())  # ...and skipped by the other beat, due at the same instant
    assert [name for name, _ in published] == ["first"]
    assert published[0][1][HEADER_KEY] == "beat-guard:export:owner"
    first.close()  # a deploy stops the owner right after it published
    second.apply_entry(tick())  # the other beat, waking a moment later for the same tick
    assert [name for name, _ in published] == ["first"]

    def second_publishes() -> bool:
        second.apply_entry(tick())
        return published[-1][0] == "second"

    took = eventually(second_publishes, timeout=HANDBACK_GRACE * 5, what="the handover")
    assert HANDBACK_GRACE * 0.5 < took < HANDBACK_GRACE * 3
    second.close()
