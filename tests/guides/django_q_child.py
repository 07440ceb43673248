"""The django-q2 guide's processes: ``qcluster`` runs ``manage.py qcluster`` (its workers forked
from it, the work recording each run); ``enqueue decorated|undecorated N`` queues N rebuilds with
``async_task`` (``undecorated``: the guide's task function without the decorator, what a test would
see if it did nothing). The guide's work is replaced when this module is imported, also by a
worker that imports ``undecorated`` by its dotted path.
"""

from __future__ import annotations

import sys
import time
import uuid

import django

django.setup()

from tests.guides import django_q_tasks  # noqa: E402
from tests.guides.runs import record  # noqa: E402


def work() -> None:
    run = uuid.uuid4().hex
    record("start", run=run)
    time.sleep(0.3)
    record("end", run=run)


django_q_tasks.rebuild_search_index = work
undecorated = django_q_tasks.rebuild_search_index_task.__wrapped__  # type: ignore[attr-defined]

if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "enqueue":
        from django_q.tasks import async_task

        mode, count = args
        path = "tests.guides.django_q_tasks.rebuild_search_index_task"
        if mode == "undecorated":
            path = "tests.guides.django_q_child.undecorated"
        for _ in range(int(count)):
            async_task(path)
    else:
        from django.core.management import call_command

        record("ready")
        call_command("qcluster")
