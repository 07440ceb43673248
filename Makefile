# The two commands of the README: `make demo` and `make test`. Both set up what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint docs servers

$(VENV)/.installed: pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
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
