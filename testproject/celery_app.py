"""The shop's Celery app: ``celery -A testproject.celery_app worker -B``.

Not named ``celery.py``: ``python testproject/manage.py`` puts ``testproject/`` on ``sys.path``,
where a ``celery.py`` would shadow Celery itself.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Beat must import the tasks to know which ones are decorated: autodiscover every app's tasks.
app.autodiscover_tasks()
