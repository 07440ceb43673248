"""The shop: a small Django project whose nightly export ran three times, fixed step by step."""

# As Celery's Django guide says: the app is loaded with Django, so @shared_task uses it.
from testproject.celery_app import app as celery_app

__all__ = ["celery_app"]
