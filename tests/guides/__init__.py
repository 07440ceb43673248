"""The examples of the task-library guides (docs/howto/), and the processes that run them.

Each ``<library>_*.py`` example module is what its docs page includes (``literalinclude``) and what
``tests/test_guides_<library>.py`` runs, in real processes of that library (APScheduler, Huey,
Dramatiq, django-q2), against a real lock store. ``children.py`` starts those processes and reads
the runs they record (``runs.py``).
"""
