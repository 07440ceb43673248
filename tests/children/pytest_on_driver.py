"""pytest in a process that can import only one PostgreSQL driver.

``python -m tests.children.pytest_on_driver DRIVER PYTEST_ARGS...``: with DRIVER ``psycopg2``,
``psycopg`` (3) cannot be imported, so Django takes psycopg2; with ``psycopg`` nothing is blocked.
Exits with pytest's status.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    driver = argv[0]
    if driver == "psycopg2":
        sys.modules["psycopg"] = None  # type: ignore[assignment]
    elif driver != "psycopg":
        raise SystemExit(f"DRIVER must be psycopg or psycopg2, got {driver!r}")
    import pytest

    return int(pytest.main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
