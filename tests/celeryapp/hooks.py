# mypy: disable-error-code="untyped-decorator"

"""Kill hooks of the beat processes (tests/test_celery_missed_ticks.py), with BEAT_HOOKS set.

A test arms one beat by writing ``arm-<pid>.json`` in the BEAT_HOOKS directory:
``{"when": "record"}`` SIGKILLs the beat right after the store confirmed a tick record
(``BeatGuard.record_tick`` answered True), before that tick is published; ``{"when": "publish",
"keys": [...]}`` SIGKILLs it right after it published (``after_task_publish``) a tick under each
of those owner lease keys. Before it dies, the beat writes what it did in ``killed-<pid>.json``.
Every ``run_skipped`` a beat sends is logged with its code (``hooks: run_skipped ...``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from celery.signals import after_task_publish, beat_init

from tests.children import env as _child

logger = logging.getLogger("tests.celeryapp.hooks")

DIRECTORY = Path(_child.read("BEAT_HOOKS") or ".")
_published: dict[str, str] = {}  # owner lease key -> the scheduled header, since armed
_in_beat = False


def armed(when: str) -> dict[str, Any] | None:
    """This process's arm file, when it says ``when``."""
    if not _in_beat:
        return None
    try:
        arm: dict[str, Any] = json.loads((DIRECTORY / f"arm-{os.getpid()}.json").read_text())
    except FileNotFoundError:
        return None
    return arm if arm.get("when") == when else None


def die(**what: Any) -> None:
    """Say what this beat did, then SIGKILL it."""
    what = {"pid": os.getpid(), "at": time.time(), **what}
    path = DIRECTORY / f"killed-{os.getpid()}.json"
    path.with_suffix(".tmp").write_text(json.dumps(what))
    path.with_suffix(".tmp").rename(path)
    os.kill(os.getpid(), signal.SIGKILL)


@beat_init.connect
def install(sender: Any = None, **kwargs: Any) -> None:
    """In a beat process only: wrap the recording call, log run_skipped with its code."""
    global _in_beat
    from django_locks.contrib.celery_beat import BeatGuard
    from django_locks.signals import run_skipped

    _in_beat = True
    record_tick = BeatGuard.record_tick

    def recording(self: BeatGuard, lock: Any, tick_ms: int) -> bool:
        recorded = record_tick(self, lock, tick_ms)
        if recorded and armed("record") is not None:
            die(when="record", key=lock.key, tick_ms=tick_ms)
        return recorded

    BeatGuard.record_tick = recording  # type: ignore[method-assign]
    run_skipped.connect(log_skipped, dispatch_uid="tests.celeryapp.hooks")


def log_skipped(sender: Any, key: str, reason: str, code: str, **kwargs: Any) -> None:
    logger.info("hooks: run_skipped key=%r code=%r reason=%r", key, code, reason)


@after_task_publish.connect
def published(sender: Any = None, headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    arm = armed("publish")
    key = (headers or {}).get("django_locks_key")
    if arm is None or key not in arm["keys"]:
        return
    _published[str(key)] = (headers or {}).get("django_locks_scheduled", "")
    if set(arm["keys"]) <= set(_published):
        die(when="publish", scheduled=_published)
