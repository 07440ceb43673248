"""A management command at most two instances of which run at once (tests of permits)."""

from __future__ import annotations

import os
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_locks.context import current_lock
from django_locks.decorators import limit_concurrency


class Command(BaseCommand):
    help = "Write one line to --out (pid, permit, token), sleeping --sleep seconds first."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default="")
        parser.add_argument("--sleep", type=float, default=0.0)

    @limit_concurrency("limited:report", permits=2, ttl="2s")
    def handle(self, *args: Any, out: str = "", sleep: float = 0.0, **options: Any) -> None:
        lock = current_lock()
        assert lock is not None and lock.permit is not None
        if sleep:
            time.sleep(sleep)
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {lock.permit} {lock.fencing_token}\n")
        self.stdout.write(f"ran with permit {lock.permit}")
