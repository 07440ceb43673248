"""Settings of the guides' child processes: tests.settings, with the LOCKS of
DJANGO_LOCKS_TEST_LOCKS and django_locks' log lines on stderr (the test prints the children's logs
when it fails)."""

from __future__ import annotations

from tests.children import env as _child
from tests.settings import *  # noqa: F403
from tests.settings import LOCKS as _LOCKS

LOCKS = _child.read_json("LOCKS") or _LOCKS

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_locks": {"level": "DEBUG", "handlers": ["console"]}},
}
