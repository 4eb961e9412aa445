"""Fixtures and hooks for every tier: the skip policy (tests/skip_policy.py)."""

pytest_plugins = ("tests.skip_policy",)
