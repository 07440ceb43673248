"""Settings of the django-q2 guide's processes: tests.guides.settings on a database of their own
(DJANGO_LOCKS_TEST_DATABASES: a fresh PostgreSQL database, the ORM broker's and the lock store's),
with django_q and two workers per cluster."""

from __future__ import annotations

from tests.children import env as _child
from tests.guides.settings import *  # noqa: F403
from tests.guides.settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "django_q"]
DATABASES = _child.read_json("DATABASES")

Q_CLUSTER = {
    "name": "guides",
    "orm": "default",
    "workers": 2,
    "timeout": 30,
    "retry": 60,
    "poll": 0.05,
    "guard_cycle": 0.1,
}
