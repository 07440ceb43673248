"""What a guide's child process records: one JSON line per event, in DJANGO_LOCKS_TEST_RUNS.

Stdlib only (and tests.children.env): the examples' stand-in work calls :func:`record`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from tests.children import env as _child

_mutex = threading.Lock()


def record(event: str, **fields: Any) -> None:
    """Append ``{"event": event, "pid": ..., "at": time.time(), **fields}`` as one line; a line is
    written in one ``write`` of an O_APPEND file, so lines of several processes never interleave."""
    line = json.dumps({"event": event, "pid": os.getpid(), "at": time.time(), **fields}) + "\n"
    with _mutex, open(_child.read("RUNS"), "a", encoding="utf-8") as fh:
        fh.write(line)
