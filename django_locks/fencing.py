"""Fenced writes: a paused holder's late write updates nothing (SPEC section 6)."""

from __future__ import annotations

from typing import Any

from django.db import models

from django_locks.lock import Lock


class FencingTokenField(models.BigIntegerField):  # type: ignore[type-arg]
    """The fencing token of the last write a row accepted (a ``BigIntegerField``, default 0)."""

    description = "Fencing token of the last accepted write"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        super().__init__(*args, **kwargs)


def fenced_update(
    queryset: models.QuerySet[Any],
    token: int | Lock,
    *,
    fencing_field: str | None = None,
    **values: Any,
) -> int:
    """Write ``values`` and ``token`` in ONE ``UPDATE``, only on rows whose stored token is not
    greater than ``token``; return the number of rows written.

    ``token`` is a fencing token (or a ``Lock``, whose token is used). ``fencing_field`` names
    the ``FencingTokenField`` when the model has several. A row last written with a greater token is
    left alone: the holder of an older lock (one that paused and lost it) writes nothing.
    """
    if isinstance(token, Lock):
        token = token.fencing_token
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise TypeError(f"`token` must be a non-negative int fencing token, got {token!r}")
    name = _token_field(queryset.model, fencing_field)
    if name in values:
        raise ValueError(f"`values` must not set {name!r}: fenced_update() writes the token itself")
    if not values:
        raise ValueError("fenced_update() needs at least one value to write")
    return queryset.filter(**{f"{name}__lte": token}).update(**values, **{name: token})


def _token_field(model: type[models.Model], field: str | None) -> str:
    fields = [f.name for f in model._meta.get_fields() if isinstance(f, FencingTokenField)]
    if field is not None:
        if field not in fields:
            raise ValueError(
                f"`fencing_field` must name a FencingTokenField of {model.__name__} "
                f"(one of {fields}), got {field!r}"
            )
        return field
    if len(fields) != 1:
        raise ValueError(
            f"{model.__name__} has {len(fields)} FencingTokenFields ({fields}); "
            "fenced_update() needs exactly one, or `fencing_field=` naming it"
        )
    return fields[0]
