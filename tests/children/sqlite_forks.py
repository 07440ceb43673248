"""Forked processes sharing one SQLite file see one holder and growing tokens.

``python -m tests.children.sqlite_forks DB`` migrates ``DB``, takes a connection, forks four
children that each try 20 acquires of one key, checks that exactly one won and that the parent's
store still works, and prints ``ok``.
"""

from __future__ import annotations

import ast
import os
import sys

import django
from django.conf import settings


def main(db: str) -> None:
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


if __name__ == "__main__":
    main(sys.argv[1])
