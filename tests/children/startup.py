"""What ``django.setup()`` says in a child process: ``started``, or the exception's class name
and message (the children that test a startup print it; call after ``settings.configure``)."""

from __future__ import annotations


def report() -> None:
    import django

    try:
        django.setup()
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("started")
