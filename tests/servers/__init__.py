"""Real servers for the test suite, started on 127.0.0.1 in throwaway directories.

Each server module (``postgres``, ``pgbouncer``, ``redis``) exposes a class that starts its server,
stops it, and dumps its log on failure. Locally a missing binary skips the tests that need it, with
the reason; under ``CI=true`` it is a failure.
"""

from __future__ import annotations

import os
import shutil
import socket

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(reason: str) -> None:
    """A server the test needs is not available: skip locally, fail in CI."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing server is a failure)", pytrace=False)
    pytest.skip(reason)


def find_binary(name: str, *candidates: str) -> str | None:
    """The path of ``name`` on PATH or among ``candidates`` (absolute paths), else None."""
    found = shutil.which(name)
    if found:
        return found
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def dump_log(path: str, *, lines: int = 60) -> str:
    """The last ``lines`` lines of a server's log, for a failure message."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError as exc:
        return f"(no log at {path}: {exc})"
