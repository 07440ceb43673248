# The two commands of the README: `make demo` and `make test`. Both set up what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint docs servers

$(VENV)/.installed: pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The distribution was called django-locks before 0.2.0: an old editable install of it (or
	# the unrelated PyPI project of that name, which also imports as django_locks) would shadow
	# this checkout.
	$(PY) -m pip uninstall -q -y django-locks 2>/dev/null || true
	$(PY) -m pip install -q -e . -r requirements-dev.txt
	touch $@

demo: $(VENV)/.installed
	$(PY) testproject/demo.py $(ARGS)

servers:
	scripts/install-servers

test: $(VENV)/.installed servers
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check django_locks tests testproject benchmarks docs/conf.py
	$(VENV)/bin/ruff format --check django_locks tests testproject benchmarks docs/conf.py
	$(VENV)/bin/mypy django_locks tests testproject benchmarks

docs: $(VENV)/.installed
	$(VENV)/bin/sphinx-build -W -q -b html docs docs/_build/html
