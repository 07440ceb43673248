"""Run the tutorial project's ``runserver`` with one change to its settings.

``python serve.py MODE ADDRPORT``, in the project's directory, where MODE is:

* ``outage``: the lock store is a database Django cannot open (a real store failure, no mock),
  so that ``locks.lock()`` raises ``StoreError`` as it does when the database is down;
* ``atomic``: ``ATOMIC_REQUESTS = True`` on the default database, as many projects set it.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

sys.path.insert(0, os.getcwd())  # the project, as manage.py would put it
os.environ["DJANGO_SETTINGS_MODULE"] = "shop.settings"


def main(mode: str, addrport: str) -> None:
    settings: Any = importlib.import_module("shop.settings")  # the tutorial's, not ours
    if mode == "outage":
        settings.DATABASES["locks"] = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(os.getcwd(), "no-such-directory", "locks.sqlite3"),
        }
        settings.LOCKS = {
            "BACKEND": "django_locks.stores.DatabaseStore",
            "OPTIONS": {"using": "locks"},
        }
    elif mode == "atomic":
        settings.DATABASES["default"]["ATOMIC_REQUESTS"] = True
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", "runserver", addrport, "--noreload"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
