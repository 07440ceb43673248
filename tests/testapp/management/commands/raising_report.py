"""A management command that fails when its previous run still runs (tests of on_conflict)."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_locks.context import current_lock
from django_locks.decorators import without_overlapping


class Command(BaseCommand):
    help = "Sleep --sleep seconds under the run lock, then print its token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sleep", type=float, default=0.0)

    @without_overlapping("raising:report", on_conflict="raise", ttl="2s")
    def handle(self, *args: Any, sleep: float = 0.0, **options: Any) -> None:
        lock = current_lock()
        assert lock is not None
        if sleep:
            time.sleep(sleep)
        self.stdout.write(f"ran with token {lock.fencing_token}")
