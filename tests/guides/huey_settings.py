"""Settings of the Huey guide's consumers: tests.guides.settings with djhuey, a RedisHuey on the
Redis of DJANGO_LOCKS_TEST_BROKER."""

from __future__ import annotations

from tests.children import env as _child
from tests.guides.settings import *  # noqa: F403
from tests.guides.settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "huey.contrib.djhuey"]

HUEY = {
    "huey_class": "huey.RedisHuey",
    "name": "guides",
    "immediate": False,
    "connection": {"url": _child.read("BROKER")},
    "consumer": {"workers": 2, "worker_type": "thread"},
}
