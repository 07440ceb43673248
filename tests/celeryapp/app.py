"""The Celery app of the test processes, configured as a Django project does."""

from __future__ import annotations

import os

from celery import Celery

from tests.children import env as _child

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celeryapp.settings")

app = Celery("celeryapp")
app.config_from_object("django.conf:settings", namespace="CELERY")

if _child.read("BEAT_HOOKS"):
    # The kill hooks of tests/test_celery_missed_ticks.py: receivers of beat's signals.
    import tests.celeryapp.hooks  # noqa: F401
