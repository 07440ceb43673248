"""One process holding many renewing locks, for tests/test_scale.py.

``python -m tests.children.scale_holder postgres|redis|cluster COUNT TTL_SECONDS KEY_PREFIX
[REDIS_URL|CLUSTER_URL]`` acquires COUNT locks ``KEY_PREFIX:0`` ... with one ``Locks`` (on
``DatabaseStore("postgres")``, alias from DJANGO_LOCKS_TEST_POSTGRES, or ``RedisStore``), prints
``held COUNT SECONDS``, then one line ``round MONOTONIC SIZE SECONDS`` as each ``renew_many`` call
returns (when it returned on the system-wide monotonic clock, its leases, how long it took). On
a ``report`` line on stdin it prints ``report JSON`` (how many locks are held, which are not);
it exits at the end of stdin, its locks left to lapse.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import django


def main(argv: list[str]) -> None:
    django.setup()
    from django_locks import Locks
    from django_locks.stores.base import LockStore
    from django_locks.stores.database import DatabaseStore
    from django_locks.stores.redis import RedisStore

    kind, count, ttl, prefix = argv[0], int(argv[1]), float(argv[2]), argv[3]
    store: LockStore
    if kind == "postgres":
        store = DatabaseStore("postgres")
    elif kind in ("redis", "cluster"):
        store = RedisStore(url=argv[4], prefix=prefix, cluster=kind == "cluster")
    else:
        raise SystemExit(f"store must be postgres, redis or cluster, got {kind!r}")

    # Each round's size and time, told as it returns: one line per round costs nothing of note
    # next to the round itself. The method is the store's own, called as the batch calls it.
    renew_many = store.renew_many
    out = threading.Lock()

    def counted(leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None) -> Any:
        began = time.monotonic()
        renewed = renew_many(leases, timeout=timeout)
        ended = time.monotonic()
        with out:
            print(f"round {ended:.6f} {len(leases)} {ended - began:.6f}", flush=True)
        return renewed

    store.renew_many = counted  # type: ignore[method-assign]

    locks = Locks(store, ttl=ttl)
    began = time.monotonic()
    held = []
    for index in range(count):
        lock = locks.acquire(f"{prefix}:{index}")
        if lock is None:
            raise SystemExit(f"{prefix}:{index} was not acquired")
        held.append(lock)
    with out:
        print(f"held {len(held)} {time.monotonic() - began:.3f}", flush=True)

    for line in sys.stdin:
        if line.strip() == "report":
            lost = [lock.key for lock in held if not lock.held]
            report = {"held": len(held) - len(lost), "lost": lost[:20]}
            with out:
                print(f"report {json.dumps(report)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
