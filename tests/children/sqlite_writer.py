"""Hold a SQLite file's write lock for 0.7 s: ``python -m tests.children.sqlite_writer DB``.

Prints ``locked`` once it holds it (BEGIN IMMEDIATE), then commits.
"""

from __future__ import annotations

import sqlite3
import sys
import time


def main() -> None:
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(0.7)
    conn.execute("COMMIT")


if __name__ == "__main__":
    main()
