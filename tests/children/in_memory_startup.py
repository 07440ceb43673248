"""A real startup with DEBUG = False and the in-memory store: what django.setup() says.

``python -m tests.children.in_memory_startup`` prints ``started``, or the exception's class name
and message.
"""

from __future__ import annotations

import django
from django.conf import settings


def main() -> None:
    settings.configure(
        DEBUG=False,
        INSTALLED_APPS=["django_locks"],
        LOCKS={"BACKEND": "django_locks.stores.InMemoryStore"},
    )
    try:
        django.setup()
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("started")


if __name__ == "__main__":
    main()
