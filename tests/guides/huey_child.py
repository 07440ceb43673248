"""The Huey guide's processes: ``consumer [-n]`` runs ``manage.py run_huey`` (two thread workers;
``-n``: without the periodic scheduler) with the guide's tasks, their work recording each run;
``enqueue decorated|undecorated N`` enqueues N imports of one supplier.

Huey's scheduler checks periodic tasks every 60 seconds; here every second (its
``Scheduler.periodic_task_seconds``), so that a test sees its ticks within seconds.
``undecorated`` is the guide's import task without ``without_overlapping``, registered under
another name: what a test would see if the decorator did nothing.
"""

from __future__ import annotations

import sys
import time
import uuid

import django


def work() -> None:
    from tests.guides.runs import record

    run = uuid.uuid4().hex
    record("start", run=run)
    time.sleep(0.3)
    record("end", run=run)


def main(command: str, *args: str) -> None:
    django.setup()
    from huey import consumer
    from huey.contrib.djhuey import HUEY

    from tests.guides import huey_tasks
    from tests.guides.runs import record

    huey_tasks.import_catalog = lambda supplier: work()
    huey_tasks.send_digest = lambda: record("digest")
    undecorated = HUEY.task(name="undecorated_import")(
        huey_tasks.import_catalog_task.func.__wrapped__
    )
    if command == "enqueue":
        mode, count = args
        target = huey_tasks.import_catalog_task if mode == "decorated" else undecorated
        for _ in range(int(count)):
            target("acme")
        return
    from django.core.management import call_command

    consumer.Scheduler.periodic_task_seconds = 1
    record("ready")
    call_command("run_huey", "--disable-autoload", *args)


if __name__ == "__main__":
    main(*sys.argv[1:])
