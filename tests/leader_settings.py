"""Settings of the ``run_leader`` processes test_run_leader.py starts: the suite's settings with
the store given in DJANGO_LOCKS_TEST_LOCKS (JSON)."""

from __future__ import annotations

from tests.children import env as _child
from tests.settings import *  # noqa: F403

LOCKS = _child.read_json("LOCKS")
# DJANGO_LOCKS_TEST_LOG_LEVEL=NONE: no LOGGING at all, as in a project that never configured it.
if _child.read("LOG_LEVEL") != "NONE":
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"console": {"class": "logging.StreamHandler"}},
        "loggers": {
            "django_locks": {
                "handlers": ["console"],
                "level": _child.read("LOG_LEVEL", "WARNING"),
            }
        },
    }
