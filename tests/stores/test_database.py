"""DatabaseStore whatever the engine: its options, validated in the constructor without I/O."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_locks.stores.database import DatabaseStore


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"using": "nowhere"}, "DATABASES"),
        ({"using": ""}, "using"),
        ({"timeout": "5x"}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"max_connections": 0}, "max_connections"),
        ({"max_connections": True}, "max_connections"),
    ],
)
def test_bad_options_are_refused_without_io(options, named):
    with pytest.raises(ImproperlyConfigured, match=named):
        DatabaseStore(**options)


def test_unknown_options_are_a_type_error():
    with pytest.raises(TypeError):
        DatabaseStore(pool=3)  # type: ignore[call-arg]
