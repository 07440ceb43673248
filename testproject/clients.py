"""Stand-ins for the outside systems the shop talks to: the accounting system and the warehouse.

A real project calls their HTTP APIs here. The stand-ins keep what they are sent in a file
(``ACCOUNTING_OUTBOX``), so the demo can count what reached accounting across every process.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings

from django_locks import AbortSignal


class AccountingClient:
    """The accounting system: receives batches of invoices. Invoice numbers are its idempotency
    keys in real life; here every batch is appended, so a double export is visible."""

    def __init__(self, outbox: Path | None = None) -> None:
        # getattr: a setting of the shop, unknown to the settings mypy runs with.
        self.outbox = Path(outbox or getattr(settings, "ACCOUNTING_OUTBOX"))  # noqa: B009

    def send_invoices(self, invoices: list[dict[str, Any]], **run: Any) -> None:
        line = {"sent_at": _now(), "invoices": invoices, **run}
        self.outbox.parent.mkdir(parents=True, exist_ok=True)
        with open(self.outbox, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # one line per batch, even from several processes
            fh.write(json.dumps(line, default=str) + "\n")

    def batches(self) -> list[dict[str, Any]]:
        if not self.outbox.exists():
            return []
        lines = self.outbox.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


@dataclasses.dataclass(frozen=True)
class StockAlert:
    position: int
    sku: str
    message: str


class WarehouseClient:
    """The warehouse: counts stock, and streams alerts (a product running low) to one subscriber."""

    def stock_counts(self, skus: list[str]) -> dict[str, int]:
        return {sku: random.randint(0, 40) for sku in skus}

    def alerts(self, *, after: int, stop: AbortSignal, every: float = 0.5) -> Iterator[StockAlert]:
        """Alerts after position ``after``, one every ``every`` seconds, until ``stop`` aborts."""
        position = after
        while not stop.wait(every):
            position += 1
            sku = random.choice(["mug", "tee", "cap"])
            yield StockAlert(position, sku, f"{sku}: {random.randint(0, 3)} left on the shelf")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()
