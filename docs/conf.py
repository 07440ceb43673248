"""Sphinx configuration of the django_locks documentation."""

from __future__ import annotations

import os
import sys

import django

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

import django_locks  # noqa: E402

project = "django_locks"
author = "django_locks developers"
release = django_locks.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
]
# Builds are offline by default (CI has no network to fetch inventories, and a failed fetch is a
# warning, hence an error under -W): DOCS_INTERSPHINX=1 links to the Python docs.
if os.environ.get("DOCS_INTERSPHINX") == "1":
    extensions.append("sphinx.ext.intersphinx")
    intersphinx_mapping = {"python": ("https://docs.python.org/3", None)}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
nitpicky = False
html_theme = "alabaster"
exclude_patterns = ["_build"]


def setup(app):  # type: ignore[no-untyped-def]
    app.add_crossref_type("setting", "setting", indextemplate="pair: %s; setting")
