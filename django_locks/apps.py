"""The django_locks app: validates ``LOCKS`` at startup, registers checks, follows changes."""

from __future__ import annotations

import importlib.util
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed


class DjangoLocksConfig(AppConfig):
    name = "django_locks"
    verbose_name = "Locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_locks import checks, conf, exporters

        # Refuse a misconfigured deploy here, without I/O: system checks do not run under
        # gunicorn, uWSGI or Celery. The configured DEBUG is seen here; test runners set
        # DEBUG = False only later.
        config = conf.read()
        conf.build_store(config)
        conf.refuse_in_memory_in_production(config, debug=settings.DEBUG)
        conf.remember_debug(settings.DEBUG)
        exporters.configure(config.metrics)
        checks.register()
        setting_changed.connect(_on_setting_changed, dispatch_uid="django_locks.setting_changed")
        if importlib.util.find_spec("celery") is not None:
            # The Celery seam's signals (beat's enforcement of on_one_instance, its headers, the
            # worker's log line), connected here and only here: importing the module does
            # nothing. Idempotent, as ready() may run again (the settings tests call it).
            from django_locks.contrib import celery as celery_integration

            celery_integration.install()
        from django_locks.contrib import tasks_compat

        if tasks_compat.installed():
            # django.tasks (Django 6.0+) or the django-tasks backport: the receivers that tell
            # a decorated function it runs as a task, and the checks of @task() functions.
            from django_locks.contrib import tasks as tasks_integration

            tasks_integration.install()


def _on_setting_changed(*, setting: str, value: Any = None, **kwargs: Any) -> None:
    if setting == "LOCKS":
        from django_locks import conf, exporters, service

        conf.reset()
        service.forget_default()
        try:
            metrics = conf.get().metrics
        except ImproperlyConfigured:
            return  # the service's first use raises it, as for any bad LOCKS
        exporters.configure(metrics)
    elif setting == "DEBUG":
        from django_locks import conf

        conf.remember_debug(settings.DEBUG)
