"""Processes of tests/test_metrics_prometheus.py: ``python -m tests.children.prometheus_exporter``.

(A startup with the exporter off, or its library missing: ``tests.children.metrics_startup``.)
* ``worker PREFIX COUNT``: a worker of a multiprocess deployment (``PROMETHEUS_MULTIPROC_DIR``
  and the settings, ``tests.leader_settings`` with DJANGO_LOCKS_TEST_LOCKS, in its environment):
  holds COUNT locks ``PREFIX:<pid>:<n>`` and campaigns for the election ``PREFIX-election``, then
  prints ``ready JSON`` (its pid, whether it leads) once it leads or was refused; on the line
  ``leading?`` it prints ``leading true|false``; on ``exit`` or the end of stdin it ends at once
  with ``os._exit``, holding its locks, as a killed worker would.
"""

from __future__ import annotations

import json
import os
import sys
import threading

# Django and the library are imported inside the functions: what they import is what is measured.


def worker(prefix: str, count: int) -> None:
    import django

    django.setup()
    from django_locks import Lock, events, leader_election, locks
    from django_locks.leader import Campaign, _elections

    held = []  # kept referenced: a Lock garbage-collected while held is abandoned
    for n in range(count):
        lock = locks.acquire(f"{prefix}:{os.getpid()}:{n}")
        assert lock is not None, n
        held.append(lock)

    election = f"{prefix}-election"
    decided = threading.Event()
    leading = threading.Event()

    def told(event: events.Event) -> None:
        if event.kind == "leadership_acquired" and event.label == election:
            leading.set()
            decided.set()
        elif event.kind == "not_acquired" and event.use == "leader" and event.label == election:
            decided.set()

    events.subscribe(told)

    def lead(lock: Lock) -> None:
        lock.signal.wait()

    leader_election(election)(lead)
    campaign = Campaign(
        _elections[election],
        locks,
        ttl_ms=locks.ttl_ms,
        grace=1.0,
        stopping=threading.Event(),
    )
    threading.Thread(target=campaign.run, daemon=True).start()
    if not decided.wait(30):
        raise SystemExit("the campaign neither led nor was refused within 30 s")
    ready = {"pid": os.getpid(), "leading": leading.is_set()}
    print("ready", json.dumps(ready), flush=True)
    for line in sys.stdin:
        if line.strip() == "leading?":
            print("leading", json.dumps(leading.is_set()), flush=True)
        elif line.strip() == "exit":
            break
    os._exit(0)  # holding its locks and the leadership: the parent reads what is left behind


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "worker":
        worker(argv[1], int(argv[2]))
    else:
        raise SystemExit(f"mode must be worker, got {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
