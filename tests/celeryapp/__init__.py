"""A Celery app and Django settings for the real worker and beat processes of the Celery tests."""
