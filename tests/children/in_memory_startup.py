"""A real startup with DEBUG = False and the in-memory store: what django.setup() says.

``python -m tests.children.in_memory_startup`` prints ``started``, or the exception's class name
and message.
"""

from __future__ import annotations

from django.conf import settings

from tests.children import startup


def main() -> None:
    settings.configure(
        DEBUG=False,
        INSTALLED_APPS=["django_locks"],
        LOCKS={"BACKEND": "django_locks.stores.InMemoryStore"},
    )
    startup.report()


if __name__ == "__main__":
    main()
