"""Fixtures shared by the whole suite; servers come from tests/servers/."""

from __future__ import annotations
