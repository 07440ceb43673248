"""A process taking permits of one key on an etcd cluster, for tests/stores/test_etcd_permits.py.

``python -m tests.children.etcd_permits race ENDPOINTS PREFIX KEY PERMITS THREADS HOLDS`` runs
THREADS threads, each taking a permit of KEY HOLDS times (retrying a full key after 2 to 10 ms),
holding it 5 to 25 ms, then releasing it; for each hold it prints ``held START END TOKEN PERMIT``
(START after acquire_permit returned, END before release was sent, on the system-wide
monotonic clock: inside the time the slot was really held), then ``done``.

``python -m tests.children.etcd_permits hold ENDPOINTS PREFIX KEY PERMITS TTL_MS`` takes one
permit, prints ``granted TOKEN PERMIT``, and renews it every quarter ttl until it is killed.

ENDPOINTS is a comma-separated list of the members' URLs.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import uuid

import django


def main(argv: list[str]) -> None:
    django.setup()
    from django_locks.holders import Holder
    from django_locks.stores.base import PermitGrant, Slot
    from django_locks.stores.etcd import EtcdStore

    mode, endpoints, prefix, key, permits = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    store = EtcdStore(endpoints=endpoints.split(","), prefix=prefix)
    holder = Holder(host="child", pid=None, kind="worker", detail=mode)
    out = threading.Lock()

    if mode == "hold":
        ttl_ms, owner = int(argv[5]), uuid.uuid4().hex
        grant = store.acquire_permit(key, owner, ttl_ms, permits, holder)
        assert isinstance(grant, PermitGrant), grant
        print(f"granted {grant.fencing_token} {grant.permit}", flush=True)
        while True:
            time.sleep(ttl_ms / 4000)
            store.renew(Slot(key, grant.permit), owner, ttl_ms)

    threads, holds = int(argv[5]), int(argv[6])

    def racer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(holds):
            owner = uuid.uuid4().hex
            while not isinstance(
                grant := store.acquire_permit(key, owner, 30_000, permits, holder), PermitGrant
            ):
                time.sleep(rng.uniform(0.002, 0.01))
            start = time.monotonic()
            time.sleep(rng.uniform(0.005, 0.025))
            end = time.monotonic()
            assert store.release(Slot(key, grant.permit), owner)
            with out:
                print(
                    f"held {start:.6f} {end:.6f} {grant.fencing_token} {grant.permit}", flush=True
                )

    workers = [threading.Thread(target=racer, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
