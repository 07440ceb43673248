"""Forked processes sharing one SQLite file see one holder and growing tokens.

``python -m tests.children.sqlite_forks DB`` migrates ``DB``, takes a connection, forks four
children that each try 20 acquires of one key, checks that exactly one won and that the parent's
store still works, and prints ``ok``. With ``permits`` after ``DB``, the children try 20
acquires each of one of the 3 permits of a key instead: exactly 3 win, each its own slot.
"""

from __future__ import annotations

import ast
import os
import pickle
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import django
from django.conf import settings

if TYPE_CHECKING:
    from django_locks.stores.database import DatabaseStore


def main(db: str, permits: bool) -> None:
    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": db}},
        INSTALLED_APPS=["django_locks"],
        USE_TZ=True,
        LOCKS={"BACKEND": "django_locks.stores.DatabaseStore"},
    )
    django.setup()
    from django.core.management import call_command

    from django_locks.stores.database import DatabaseStore

    call_command("migrate", verbosity=0)
    store = DatabaseStore()
    store.acquire("warm-up", "parent", 1000)  # the parent has a connection before forking
    if permits:
        permits_of_one_key(store)
        return
    children = []
    for n in range(4):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            won = [store.acquire("shared", f"child-{n}-{i}", 60_000) for i in range(20)]
            os.write(write, repr(won).encode())
            os._exit(0)
        os.close(write)
        children.append((pid, read))
    results: list[int | None] = []
    for pid, read in children:
        os.waitpid(pid, 0)
        results.extend(ast.literal_eval(os.fdopen(read).read()))
    winners = [t for t in results if t is not None]
    assert len(winners) == 1, results
    assert store.acquire("warm-up", "parent", 1000) is not None  # still usable
    assert store.force_release("shared")
    token = store.acquire("shared", "parent", 1000)
    assert token is not None and token > winners[0], (token, winners)
    print("ok")


def permits_of_one_key(store: DatabaseStore) -> None:
    from django_locks.holders import Holder
    from django_locks.stores.base import PermitGrant

    results = forked(
        lambda n: [
            store.acquire_permit("shared", f"child-{n}-{i}", 60_000, 3, Holder(host="c", pid=n))
            for i in range(20)
        ]
    )
    grants = [grant for grant in results if isinstance(grant, PermitGrant)]
    assert sorted(grant.permit for grant in grants) == [1, 2, 3], results
    assert len({grant.fencing_token for grant in grants}) == 3, grants
    assert all(isinstance(got, Holder) for got in results if not isinstance(got, PermitGrant))
    assert store.force_release("shared")
    token = store.acquire("shared", "parent", 1000)
    assert token is not None and token > max(grant.fencing_token for grant in grants)
    print("ok")


def forked(attempts: Callable[[int], list[Any]]) -> list[Any]:
    """What ``attempts(n)`` answered in each of four forked children, all together."""
    children = []
    for n in range(4):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, pickle.dumps(attempts(n)))
            os._exit(0)
        os.close(write)
        children.append((pid, read))
    results: list[Any] = []
    for pid, read in children:
        os.waitpid(pid, 0)
        with os.fdopen(read, "rb") as answers:
            results.extend(pickle.loads(answers.read()))
    return results


if __name__ == "__main__":
    main(sys.argv[1], permits=sys.argv[2:] == ["permits"])
