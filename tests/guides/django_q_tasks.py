# myproject/tasks.py
"""django-q2 tasks that never run twice at once, whichever cluster and worker takes them."""

from __future__ import annotations

from django_locks import without_overlapping


def rebuild_search_index() -> None:
    """The work itself: a full rebuild of the search index."""


@without_overlapping("search:rebuild")
def rebuild_search_index_task() -> None:
    rebuild_search_index()
