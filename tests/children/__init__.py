"""Child processes the tests start: their modules (``python -m tests.children.<name>``) and env."""
