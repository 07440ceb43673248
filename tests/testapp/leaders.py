"""Leaders of the test suite, found by ``run_leader`` through autodiscovery."""

from __future__ import annotations

import os
import time

from django.db.models import F

from django_locks import Lock, leader_election
from django_locks.fencing import fenced_update
from tests.children import env as _child
from tests.testapp.models import LeaderWrite, StockCount

KEY = "tests:fenced-writer"


@leader_election(KEY)
def fenced_writer(lock: Lock) -> None:
    """Write every 50 ms while leading: a fenced increment, and a log of the attempt."""
    alias = _child.read("LEADER_DATABASE", "default")
    rows = StockCount.objects.using(alias).filter(product=KEY)
    while not lock.signal.aborted:
        started = time.monotonic()
        accepted = fenced_update(rows, lock, count=F("count") + 1)
        LeaderWrite.objects.using(alias).create(
            key=KEY,
            pid=os.getpid(),
            fencing_token=lock.fencing_token,
            started=started,
            ended=time.monotonic(),
            accepted=bool(accepted),
        )
        lock.signal.wait(0.05)


STUBBORN = "tests:stubborn"


@leader_election(STUBBORN)
def stubborn(lock: Lock) -> None:
    """Work that ignores its signal: run_leader must still exit once the grace is over."""
    print(f"stubborn work started (fencing token {lock.fencing_token})", flush=True)
    time.sleep(60)
