"""Fault injection for django_locks: worker processes on the public API, a nemesis, a recorded
history and a checker of SPEC section 6 (P1 to P5). See docs/internals/faults.rst.

``python -m tests.faults --scenario NAME --store postgres|redis --duration 30 --seed N``
"""
