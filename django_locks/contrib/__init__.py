"""Integrations with optional dependencies, each imported only when its dependency is installed."""
