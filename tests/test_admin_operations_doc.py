"""The ready-to-copy ``lock_lost`` alert of docs/howto/operations.rst works as printed."""

from __future__ import annotations

import logging
import re
import textwrap
from pathlib import Path

import pytest

from django_locks.service import Locks
from django_locks.signals import lock_lost
from django_locks.stores.memory import InMemoryStore
from django_locks.testing import ManualClock

DOC = Path(__file__).resolve().parent.parent / "docs" / "howto" / "operations.rst"


def alert_example() -> str:
    text = DOC.read_text()
    start = text.index("into one of your apps, connected from its ``AppConfig.ready()``:")
    block = re.search(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", text[start:])
    assert block is not None
    return textwrap.dedent(block.group(1))


def test_the_alert_example_logs_one_warning_with_every_field(caplog: pytest.LogCaptureFixture):
    namespace: dict[str, object] = {}
    exec(compile(alert_example(), str(DOC), "exec"), namespace)
    try:
        clock = ManualClock()
        store = InMemoryStore(clock=clock)
        service = Locks(store, ttl="3s", clock=clock)
        lock = service.acquire("invoices:nightly-export")
        assert lock is not None
        store.force_release("invoices:nightly-export")  # by hand, as the admin does
        with caplog.at_level(logging.WARNING, logger="myproject.alerts"):
            clock.advance("2s")  # the next renewal is refused
        [record] = [r for r in caplog.records if r.name == "myproject.alerts"]
        assert record.levelno == logging.WARNING
        message = record.getMessage()
        assert "key='invoices:nightly-export'" in message
        assert f"fencing_token={lock.fencing_token}" in message
        assert "detected_by=renewal" in message
        assert "host=" in message and "pid=" in message
        assert record.__dict__["lock_key"] == "invoices:nightly-export"
        assert record.__dict__["detected_by"] == "renewal"
    finally:
        lock_lost.disconnect(dispatch_uid="myproject.alert_on_lock_lost")
