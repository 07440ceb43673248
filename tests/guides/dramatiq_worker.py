"""The Dramatiq guide's processes. ``python -m dramatiq tests.guides.dramatiq_worker`` is a worker
of the guide's actors (Django set up first, the broker a RedisBroker on DJANGO_LOCKS_TEST_BROKER),
their work recording each run; ``python -m tests.guides.dramatiq_worker send ACTOR N`` sends N
messages for account 7 (``undecorated``: the skipping actor's function without the decorator, what
a test would see if it did nothing).
"""

from __future__ import annotations

import sys
import time
import uuid

import django
import dramatiq
from dramatiq.brokers.redis import RedisBroker

from tests.children import env as _child

django.setup()
dramatiq.set_broker(RedisBroker(url=_child.read("BROKER")))

from tests.guides import dramatiq_actors  # noqa: E402  (after the broker: actors bind to it)
from tests.guides.runs import record  # noqa: E402


def work(account_id: int) -> None:
    run = uuid.uuid4().hex
    record("start", run=run, account=account_id)
    time.sleep(0.3)
    record("end", run=run, account=account_id)


dramatiq_actors.sync_account = work
undecorated = dramatiq.actor(actor_name="undecorated")(
    dramatiq_actors.sync_account_actor.fn.__wrapped__  # type: ignore[attr-defined]
)

if __name__ == "__main__":
    program, command, actor, how_many = sys.argv
    assert command == "send"
    count = int(how_many)
    target = {
        "skip": dramatiq_actors.sync_account_actor,
        "raise": dramatiq_actors.sync_account_each_time,
        "undecorated": undecorated,
    }[actor]
    for _ in range(count):
        target.send(7)
    record("sent", actor=actor, count=count)
