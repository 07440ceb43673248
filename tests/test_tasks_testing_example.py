"""The testing example of the django.tasks page (docs/topics/tasks.rst includes the part between
the markers): a project's own TestCase for a unique task, on the dummy and immediate backends."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

import pytest

# Collected only where Django 6.0's django.tasks is installed (tests/conftest.py collect_ignore):
# the example's backend paths are django.tasks.backends.*; its tasks run on the backport in
# tests/test_tasks_unique.py.
# example: start
from django.test import TestCase, override_settings

from django_locks import AlreadyQueuedError
from django_locks.contrib.tasks import enqueue_unique, try_enqueue_unique
from django_locks.testing import reset_locks

# In your project: from reports.tasks import rebuild_report (RUNS: what the task recorded).
from tests.tasks_app.reports_example import RUNS, rebuild_report

# Django 5.2 with the backport: "django_tasks.backends.dummy.DummyBackend", and so on.
DUMMY = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
IMMEDIATE = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}


@override_settings(TASKS=DUMMY)  # enqueue() only queues: nothing runs
class RebuildReportEnqueueTests(TestCase):
    def setUp(self) -> None:
        reset_locks()  # the keys the last test left queued

    def test_a_second_enqueue_of_the_same_arguments_is_refused(self) -> None:
        enqueue_unique(rebuild_report, (7,), ttl="1h")
        with self.assertRaises(AlreadyQueuedError):
            enqueue_unique(rebuild_report, kwargs={"customer_id": 7}, ttl="1h")
        self.assertIsNone(try_enqueue_unique(rebuild_report, (7, False), ttl="1h"))
        self.assertIsNotNone(try_enqueue_unique(rebuild_report, (8,), ttl="1h"))


@override_settings(TASKS=IMMEDIATE)  # enqueue() runs the task before it returns
class RebuildReportRunTests(TestCase):
    def setUp(self) -> None:
        reset_locks()
        RUNS.clear()

    def test_it_runs_and_frees_its_key(self) -> None:
        enqueue_unique(rebuild_report, (7,), ttl="1h")
        enqueue_unique(rebuild_report, (7,), ttl="1h")  # the first one has finished
        self.assertEqual(RUNS, [7, 7])


# example: end

pytestmark = [pytest.mark.tasks, pytest.mark.django_db]
