"""Import the tutorial's optional Celery part and run its task once, as a direct call does.

Run in the project's directory after the optional files are written; prints one line per fact
the test checks. Only the public surface: the run lock is seen held by trying to take it.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.getcwd())  # the project, as manage.py would put it
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")


def main() -> None:
    import django

    django.setup()
    from django_locks import locks

    # The tutorial's modules, not the suite's (hence no static imports).
    celery_app = importlib.import_module("shop").celery_app
    settings: Any = importlib.import_module("shop.settings")
    celery_app.loader.import_default_modules()  # what a worker and beat do at start
    entry = settings.CELERY_BEAT_SCHEDULE["nightly-export"]
    task = celery_app.tasks[entry["task"]]
    print("schedule", entry["schedule"])
    results: list[Any] = []
    run = threading.Thread(target=lambda: results.append(task()))
    run.start()
    time.sleep(1)  # the stand-in export takes five seconds
    other = locks.acquire("invoices:nightly-export")
    print("run lock free during the run:", other is not None)
    run.join()
    print("direct call returned", results[0])


if __name__ == "__main__":
    main()
