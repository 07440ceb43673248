"""A holder inside ``lock.atomic()`` that stops where the test SIGSTOPs it (tests.settings,
DJANGO_LOCKS_TEST_POSTGRES).

``python -m tests.children.atomic_holder WHERE KEY TTL_SECONDS``: takes ``KEY`` on the
``postgres`` alias, prints ``{"token": ...}``, enters ``lock.atomic()``, adds 100 to the
``StockCount`` row named ``KEY`` and prints ``PAUSE`` either right after that write
(``after_write``) or after the block's last statement, just before its COMMIT
(``before_commit``); it then waits for a line on stdin and prints how the block ended.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import django


def pause() -> None:
    print("PAUSE", flush=True)
    sys.stdin.readline()


def main(where: str, key: str, ttl: str) -> None:
    django.setup()
    from django.db.models import F

    from django_locks import Locks
    from django_locks.atomic import LeaseAtomic
    from django_locks.stores.database import DatabaseStore
    from tests.testapp.models import StockCount

    if where == "before_commit":
        last = LeaseAtomic._before_commit

        def before_commit(self: LeaseAtomic, conn: Any) -> None:
            last(self, conn)
            pause()

        LeaseAtomic._before_commit = before_commit  # type: ignore[method-assign]
    elif where != "after_write":
        raise SystemExit(f"WHERE must be after_write or before_commit, got {where!r}")
    lock = Locks(DatabaseStore("postgres"), ttl=float(ttl)).acquire(key)
    assert lock is not None
    print(json.dumps({"token": lock.fencing_token}), flush=True)
    try:
        with lock.atomic():
            StockCount.objects.using("postgres").filter(product=key).update(count=F("count") + 100)
            if where == "after_write":
                pause()
        outcome = {"outcome": "committed"}
    except Exception as exc:
        outcome = {"outcome": type(exc).__name__, "message": str(exc)}
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
