"""``python -m tests.children.tasks_unique_enqueue NAME THREADS START_AT TTL``: THREADS threads
each call ``try_enqueue_unique(sleep_for, (NAME,), ttl=TTL)`` at the instant START_AT (time.time());
prints one JSON line, ``{"queued": [result ids], "refused": n}``."""

from __future__ import annotations

import json
import sys
import threading
import time


def main() -> None:
    import django

    django.setup()
    from django.db import connections

    from django_locks.contrib.tasks_unique import try_enqueue_unique
    from tests.children.tasks_unique_tasks import sleep_for

    name, threads, start_at, ttl = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    queued: list[str] = []
    refused: list[int] = []
    errors: list[str] = []

    def one() -> None:
        time.sleep(max(0.0, start_at - time.time()))
        try:
            result = try_enqueue_unique(sleep_for, (name,), ttl=ttl)
        except Exception as exc:  # reported, and the test fails on it
            errors.append(repr(exc))
        else:
            if result is None:
                refused.append(1)
            else:
                queued.append(str(result.id))
        finally:
            connections.close_all()

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps({"queued": queued, "refused": len(refused), "errors": errors}))


if __name__ == "__main__":
    main()
