"""An app whose ``tasks`` module nothing imports: the django.tasks checks import it themselves
(tests/test_tasks_seam.py), as Celery's autodiscover_tasks() would."""
