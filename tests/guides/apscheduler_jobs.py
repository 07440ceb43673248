# myproject/scheduler.py
"""APScheduler started in every web worker: each tick of the job runs on one worker of the fleet."""

from __future__ import annotations

import datetime

from apscheduler.schedulers.background import BackgroundScheduler

from django_locks import on_one_instance


def refresh_dashboards() -> None:
    """The work itself: whatever the project does every five minutes."""


@on_one_instance(key="dashboards:refresh")
def refresh_dashboards_job() -> None:
    refresh_dashboards()


def start_scheduler(
    every: datetime.timedelta = datetime.timedelta(minutes=5),
    start_date: datetime.datetime | None = None,
) -> BackgroundScheduler:
    """Start this process's scheduler (gunicorn's ``post_worker_init`` hook calls it)."""
    scheduler = BackgroundScheduler(timezone=datetime.UTC)
    scheduler.add_job(
        refresh_dashboards_job,
        "interval",
        seconds=every.total_seconds(),
        start_date=start_date,
        id="dashboards:refresh",
        coalesce=True,  # after a stall, one run rather than one per tick missed
        max_instances=1,  # counted in this process only: on_one_instance is the fleet's rule
    )
    scheduler.start()
    return scheduler
