"""The Celery app of the test processes, configured as a Django project does."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.celeryapp.settings")

app = Celery("celeryapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
