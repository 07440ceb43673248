"""What importing the Celery seam connects, sets or registers, probed in a fresh interpreter.

``python -m tests.children.celery_seam_probe`` prints one JSON line: the receivers of Celery's
signals and its app finalizers before and after importing django_locks.contrib.celery, whether a
task-name hook was set, the same after install(), and the run lock key of a task run without
install(). Only Celery and Django's settings are imported before the first count.
"""

from __future__ import annotations

import json
from typing import Any

import celery.app.task  # (Celery's own import-time registrations: its built-in tasks)
import celery.local
import celery.signals
from celery import _state
from celery.utils.dispatch import Signal
from django.conf import settings


def state() -> dict[str, Any]:
    signals = {
        name: len(signal.receivers)
        for name, signal in vars(celery.signals).items()
        if isinstance(signal, Signal)
    }
    return {"signals": signals, "finalizers": len(_state._on_app_finalizers)}


def main() -> None:
    settings.configure(LOCKS={"BACKEND": "django_locks.stores.InMemoryStore"}, INSTALLED_APPS=[])
    before = state()
    import django_locks.contrib.celery as seam
    import django_locks.run as run

    imported = state()
    hook = run._task_name_hook is not None
    seam.install()
    installed = state()

    from celery import Celery

    from django_locks import current_lock, without_overlapping

    app = Celery("probe", set_as_current=True)

    @app.task(name="probe.named")  # type: ignore[untyped-decorator]
    @without_overlapping()
    def named() -> str:
        lock = current_lock()
        assert lock is not None
        return lock.key

    key = named.apply().get()
    found = {"before": before, "imported": imported, "hook": hook, "installed": installed}
    print(json.dumps({**found, "key": key}))


if __name__ == "__main__":
    main()
