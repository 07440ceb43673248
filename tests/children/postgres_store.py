"""Another process on the test PostgreSQL (DJANGO_LOCKS_TEST_POSTGRES, tests.settings).

``python -m tests.children.postgres_store acquire KEY OWNER TTL_MS`` prints what
``DatabaseStore("postgres").acquire`` returned (a token or None); ``... hold KEY TTL_SECONDS``
acquires ``KEY`` with a renewing ``Locks``, prints its fencing token and sleeps until killed.
"""

from __future__ import annotations

import sys
import time

import django


def main(argv: list[str]) -> None:
    django.setup()
    from django_locks import Locks
    from django_locks.stores.database import DatabaseStore

    command, key = argv[0], argv[1]
    if command == "acquire":
        print(DatabaseStore("postgres").acquire(key, argv[2], int(argv[3])))
    elif command == "hold":
        lock = Locks(DatabaseStore("postgres"), ttl=float(argv[2])).acquire(key)
        assert lock is not None
        print(lock.fencing_token, flush=True)
        time.sleep(600)
    else:
        raise SystemExit(f"command must be acquire or hold, got {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
