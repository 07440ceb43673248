"""A process of the rolling-upgrade test (tests/test_rolling_upgrade.py), run by the previous
release's virtualenv or by the current tree's.

Run as a script (``python tests/children/rolling_upgrade.py ...``), never with ``-m``: the
script's own directory is then the first entry of ``sys.path``, not the checkout, so
``import django_locks`` finds the release installed in the interpreter's environment.

    rolling_upgrade.py migrate DATABASE_JSON VERSION
    rolling_upgrade.py contend DATABASE_JSON VERSION STORE OUT SECONDS KEYS...

``contend`` loops acquire / hold / release on the shared KEYS for SECONDS on the ``database`` or
``redis`` STORE (a Redis URL follows ``redis=``) and writes one JSON line per hold to OUT: key,
fencing token, start and end (``time.monotonic()``, one clock for every process of the machine).
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any


def setup(database: dict[str, Any], version: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY="upgrade-test",
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_locks"],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    import django_locks

    # The release under test, not whatever happens to be on sys.path.
    if django_locks.__version__ != version:
        raise SystemExit(f"expected django_locks {version}, imported {django_locks.__version__}")


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def contend(store_name: str, out: str, seconds: float, keys: list[str]) -> None:
    from django_locks import Locks
    from django_locks.stores import DatabaseStore, RedisStore

    if store_name == "database":
        store: Any = DatabaseStore(using="default")
    else:
        store = RedisStore(url=store_name.removeprefix("redis="))
    # One hold of each process outlives the ttl: the background renewer keeps it.
    service = Locks(store, ttl="3s")
    rng = random.Random()
    began = time.monotonic()
    deadline = began + seconds
    long_hold_due = True
    holds = 0
    with open(out, "w") as fh:
        while time.monotonic() < deadline:
            key = rng.choice(keys)
            lock = service.acquire(key, wait="2s")
            if lock is None:
                continue  # the other processes kept it for two seconds: fine, try again
            start = time.monotonic()
            if long_hold_due and start > began + 1:
                long_hold_due = False
                time.sleep(3.5)
            else:
                time.sleep(rng.uniform(0.005, 0.03))
            end = time.monotonic()
            held = lock.held
            released = lock.release()
            record = {
                "key": key,
                "token": lock.fencing_token,
                "start": start,
                "end": end,
                "held": held,
                "released": released,
            }
            fh.write(json.dumps(record) + "\n")
            holds += 1
    if not holds:
        raise SystemExit("no hold at all in the whole run")
    store.close()


def main(argv: list[str]) -> None:
    command, database, version = argv[0], json.loads(argv[1]), argv[2]
    setup(database, version)
    if command == "migrate":
        migrate()
    elif command == "contend":
        contend(argv[3], argv[4], float(argv[5]), argv[6:])
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
