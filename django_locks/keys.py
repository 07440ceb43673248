"""Lock keys: validation, and templates formatted from a call's arguments."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any

MAX_KEY_LENGTH = 500

MAX_PERMITS = 1000
"""The most permits one key may have (``permits=``): each is a lease of its own (SPEC 12)."""


def validate_key(key: object, *, name: str = "key", suffix: str = "") -> str:
    """Return ``key`` if it is a valid lock key (with ``suffix`` appended, if any).

    A key is a ``str`` of 1 to 500 characters (``suffix`` included, for derived keys such as
    ``<key>:owner``), any Unicode except NUL and lone surrogates, kept exactly as given.
    """
    if not isinstance(key, str):
        raise TypeError(f"`{name}` must be a str, got {type(key).__name__} {key!r}")
    if not key:
        raise ValueError(f"`{name}` must be 1 to {MAX_KEY_LENGTH} characters, got ''")
    full = key + suffix
    if len(full) > MAX_KEY_LENGTH:
        derived = f" once {suffix!r} is appended" if suffix else ""
        raise ValueError(
            f"`{name}` must be 1 to {MAX_KEY_LENGTH} characters{derived}, "
            f"got {len(full)}: {key[:40]!r}..."
        )
    if "\x00" in key:
        raise ValueError(f"`{name}` must not contain NUL characters, got {key!r}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"`{name}` must not contain lone surrogates (it must encode as UTF-8), got {key!r}"
        ) from None
    return full


def check_permits(permits: object, *, name: str = "permits") -> int:
    """``permits``, checked: an ``int`` of 1 to :data:`MAX_PERMITS` (1: a plain lock)."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"`{name}` must be an int of 1 to {MAX_PERMITS}, got {permits!r}")
    if not 1 <= permits <= MAX_PERMITS:
        raise ValueError(f"`{name}` must be 1 to {MAX_PERMITS}, got {permits!r}")
    return permits


def permit_suffix(permits: int) -> str:
    """What a key taken with ``permits`` has appended in its longest slot key (``#<permits>``):
    a slot key counts towards the 500 characters (SPEC section 2)."""
    return f"#{permits}" if permits > 1 else ""


def template_fields(template: str) -> list[str]:
    """The top-level names a key template refers to (``"report:{customer.id}"`` -> customer)."""
    names = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        head = field.split(".", 1)[0].split("[", 1)[0]
        if not head or head.isdigit():
            raise ValueError(
                f"key template {template!r} must name the function's arguments "
                f"(such as '{{customer_id}}'), got {{{field}}}"
            )
        names.append(head)
    return names


def check_template(template: str, func: Callable[..., Any]) -> None:
    """Fail at decoration time if ``template`` names an argument ``func`` does not take."""
    params = inspect.signature(func).parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for field in template_fields(template):
        if field not in params and not takes_kwargs:
            raise ValueError(
                f"key template {template!r} names {field!r}, which "
                f"{func.__qualname__}() does not take"
            )


def render_key(
    template: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> str:
    """Format ``template`` with the arguments of one call of ``func`` (defaults applied).

    A field the call does not supply (a ``**kwargs`` name left out), or one that cannot be
    reached or formatted (``{customer.pk}`` on ``None``, ``{ids[3]}`` of two ids), is a
    ``ValueError`` naming the template and the field.
    """
    if not template_fields(template):
        return template
    return _KeyFormatter(template).format(template, **call_arguments(func, args, kwargs))


def call_arguments(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """One call's arguments by name: bound to ``func``'s signature, defaults applied, the
    ``**kwargs`` parameter's entries merged in (``TypeError`` when the call does not fit)."""
    signature = inspect.signature(func)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    for param in signature.parameters.values():
        if param.kind is param.VAR_KEYWORD:
            values.update(values.pop(param.name, {}))
    return values


class _KeyFormatter(string.Formatter):
    """``str.format`` whose failures name the template's field."""

    def __init__(self, template: str) -> None:
        self.template = template

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        head = field_name.split(".", 1)[0].split("[", 1)[0]
        if head not in kwargs:
            raise ValueError(
                f"key template {self.template!r} names {head!r}, which this call does not "
                f"supply (give it as an argument)"
            )
        try:
            return super().get_field(field_name, args, kwargs)
        except (LookupError, AttributeError, TypeError, ValueError) as exc:
            raise ValueError(
                f"key template {self.template!r}: field {{{field_name}}} cannot be read from "
                f"this call's arguments ({type(exc).__name__}: {exc})"
            ) from None

    def format_field(self, value: Any, format_spec: str) -> Any:
        try:
            return super().format_field(value, format_spec)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"key template {self.template!r}: {type(value).__name__} value cannot be "
                f"formatted with {format_spec!r} ({exc})"
            ) from None
