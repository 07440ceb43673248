"""Hold a key of the tutorial project's configured store until stdin closes.

Run with the project's directory as the working directory: ``python hold.py KEY``. Prints
``held <token>`` once the lock is taken, so that the test knows when to look.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.getcwd())  # the project, as manage.py would put it
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")


def main(key: str) -> None:
    import django

    django.setup()
    from django_locks import locks

    with locks.lock(key) as lock:
        print("held", lock.fencing_token, flush=True)
        sys.stdin.read()  # until the test closes our stdin
    print("released", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
