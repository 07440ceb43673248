"""The COMMAND of the ``run_leader --exec`` tests: records its own start, a beat every 5 ms and
its stop to a shared file, as JSON lines with ``time.monotonic()`` (CLOCK_MONOTONIC: one clock
for every process of the machine), its pid, its instance (``EXEC_INSTANCE``) and the fencing
token it was given.

``python tests/children/exec_recorder.py FILE MODE [SECONDS [CODE]]``. MODE ``run``: run until
SIGTERM, then record the stop and exit 0; ``ignore-term``: ignore SIGTERM (only SIGKILL ends
it; its last beat is its end); ``exit``: exit with CODE after SECONDS. Stdlib only, no Django.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

BEAT = 0.005


def main() -> None:
    path, mode = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    code = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    fields = {
        "pid": os.getpid(),
        "instance": os.environ.get("EXEC_INSTANCE", ""),
        "token": os.environ.get("DJANGO_LOCKS_FENCING_TOKEN", ""),
    }

    def record(event: str, **extra: object) -> None:
        line = json.dumps({"event": event, "t": time.monotonic(), **fields, **extra})
        os.write(fd, line.encode() + b"\n")  # one write of a short line to O_APPEND: atomic

    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    record("start", mode=mode)
    began = time.monotonic()
    while not stopping:
        if mode == "exit" and time.monotonic() - began >= seconds:
            record("stop", code=code)
            sys.exit(code)
        record("beat")
        time.sleep(BEAT)
    record("stop", code=0)


if __name__ == "__main__":
    main()
