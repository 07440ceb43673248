"""An enqueuing process of the Celery uniqueness tests: ``python -m tests.celeryapp.enqueue
TASK CALLS_JSON THREADS START_AT OUT``.

Sets Django up with the Celery test settings (tests/celeryapp/settings.py, from the environment
tests.celeryapp.processes builds), warms the store and broker connections up, then at the wall
clock time START_AT calls ``apply_async`` of the task TASK (tests.celeryapp.unique_tasks) from
THREADS threads at once, each with CALLS_JSON (``{"args": [...], "kwargs": {...}, "options":
{...}}``). CALLS_JSON may be a list of such calls instead, each with ``"after"`` (seconds after
START_AT): made one after the other, in one thread. Writes one JSON list to OUT: per call,
``{"id": task id}`` or ``{"refused": holder}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


def main(task_name: str, calls: Any, threads: int, start_at: float, out: str) -> None:
    import django

    django.setup()
    from django_locks import AlreadyQueuedError, locks
    from tests.celeryapp import unique_tasks
    from tests.celeryapp.app import app

    task = getattr(unique_tasks, task_name)
    with app.connection_for_write() as conn:
        conn.ensure_connection()
    locks.store.release("warm-up", "nobody")  # the store's connection, before the start
    task.name  # noqa: B018  (evaluate the proxy: the app finalized, the task patched)
    results: list[dict[str, Any]] = []
    mutex = threading.Lock()

    def one(call: dict[str, Any], at: float) -> None:
        time.sleep(max(0.0, at - time.time()))
        try:
            result = task.apply_async(
                call.get("args"), call.get("kwargs"), **call.get("options", {})
            )
            outcome: dict[str, Any] = {"id": result.id, "at": time.time()}
        except AlreadyQueuedError as exc:
            outcome = {"refused": str(exc.holder), "key": exc.key, "at": time.time()}
        with mutex:
            results.append(outcome)

    if isinstance(calls, list):
        for call in calls:
            one(call, start_at + call.get("after", 0))
        threads = 0
    workers = [threading.Thread(target=one, args=(calls, start_at)) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    with open(out + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(results, fh)
    import os

    os.rename(out + ".tmp", out)


if __name__ == "__main__":
    name, calls, count, at, path = sys.argv[1:6]
    main(name, json.loads(calls), int(count), float(at), path)
