"""Beat schedules of the Celery tests."""

from __future__ import annotations

import datetime
import math

from celery.schedules import schedstate, schedule


class Aligned(schedule):  # type: ignore[misc]
    """Every ``run_every``, on the wall clock's multiples of it: each beat, whenever it started,
    is due at the same instants (a 2 s schedule ticks at every even second), so one tick is one
    instant on every beat. ``run_every`` is kept (beat's missed-ticks check reads it)."""

    def is_due(self, last_run_at: datetime.datetime) -> schedstate:
        period = self.run_every.total_seconds()
        now = self.now().timestamp()
        last = self.maybe_make_aware(last_run_at).timestamp()
        current = math.floor(now / period)
        return schedstate(current > math.floor(last / period), (current + 1) * period - now)

    def remaining_estimate(self, last_run_at: datetime.datetime) -> datetime.timedelta:
        due, wait = self.is_due(last_run_at)
        return datetime.timedelta(0 if due else wait)

    def __repr__(self) -> str:
        return f"<aligned: every {self.run_every}>"
