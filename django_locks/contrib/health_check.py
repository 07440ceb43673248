"""A django-health-check backend: the checks of ``manage.py locks health``, as one check."""

from __future__ import annotations

import dataclasses
import datetime

try:
    from health_check.base import HealthCheck  # type: ignore[import-untyped]
    from health_check.exceptions import ServiceUnavailable  # type: ignore[import-untyped]
except ImportError as exc:  # not installed, or 3.x, whose backends are registered otherwise
    raise ImportError(
        "django_locks.contrib.health_check needs django-health-check 4.x (the HealthCheck "
        "class of health_check.base): pip install 'django-distributed-locks[health-check]'"
    ) from exc

from django_locks import health
from django_locks.durations import timeout_seconds
from django_locks.keys import validate_key


@dataclasses.dataclass
class Locks(HealthCheck):  # type: ignore[misc]
    """The configured lock store answers, and every registered election has a leader.

    List it in ``HealthCheckView.as_view(checks=[...])``:
    ``"django_locks.contrib.health_check.Locks"``, or with options
    ``("django_locks.contrib.health_check.Locks", {"elections": ["reports:nightly"]})``.
    ``elections`` adds keys (as ``locks health --election``); ``skip_registered`` leaves out
    the elections found in code (``--skip-registered``); ``timeout`` bounds all the checks
    together. A failure raises ``ServiceUnavailable`` with one line per failed check, each
    with its fix: the store's name (its host and port or database alias) and the leaders'
    hosts show in the report, never a password or an owner id.
    """

    elections: tuple[str, ...] | list[str] = ()
    skip_registered: bool = False
    timeout: datetime.timedelta = dataclasses.field(
        default=datetime.timedelta(seconds=health.DEFAULT_TIMEOUT), repr=False
    )

    def __post_init__(self) -> None:
        # Bad options fail where the view is configured, not as each probe's "unknown error".
        if isinstance(self.elections, str):  # would be read as one key per character
            raise TypeError(
                f"`elections` must be a list of election keys, got the str {self.elections!r}: "
                f"write [{self.elections!r}]"
            )
        for key in self.elections:
            validate_key(key, name="elections")
        self._timeout_s = timeout_seconds(self.timeout, name="timeout")

    def run(self) -> None:
        """The checks (synchronous: the view runs it in a worker thread)."""
        expected = health.elections(self.elections, registered=not self.skip_registered)
        results = health.run(expected, timeout=self._timeout_s)
        failed = [str(result) for result in results if not result.ok]
        if failed:
            raise ServiceUnavailable(" | ".join(failed))
