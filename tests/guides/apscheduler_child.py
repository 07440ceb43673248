"""One "web worker" of the APScheduler guide: the guide's scheduler, started as its gunicorn hook
would, its job's work recording each run; SIGTERM stops it as gunicorn stops a worker.

``python -m tests.guides.apscheduler_child decorated|undecorated EVERY START``: the job every
EVERY seconds from the instant START (epoch seconds: every process ticks at the same instants);
``undecorated`` schedules the job's function without ``on_one_instance``, to show the duplicates.
"""

from __future__ import annotations

import datetime
import signal
import sys
import time
from typing import Any

import django


def main(mode: str, every: float, start: float) -> None:
    django.setup()
    from tests.guides import apscheduler_jobs as jobs
    from tests.guides.runs import record

    jobs.refresh_dashboards = lambda: record("run")  # the work: the test counts runs per tick
    if mode == "undecorated":
        jobs.refresh_dashboards_job = jobs.refresh_dashboards_job.__wrapped__  # type: ignore[attr-defined]

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)  # gunicorn's graceful stop: the worker exits, atexit runs

    signal.signal(signal.SIGTERM, stop)
    scheduler = jobs.start_scheduler(
        datetime.timedelta(seconds=every),
        datetime.datetime.fromtimestamp(start, datetime.UTC),
    )
    record("ready")
    try:
        while True:
            time.sleep(0.05)
    finally:
        scheduler.shutdown()  # gunicorn's worker_exit hook, as the guide says


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
