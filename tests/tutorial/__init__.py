"""Processes the tutorial test runs inside the project it builds from docs/tutorial.rst."""
