"""Waiting in tests: on a condition, with a deadline, never a bare sleep before an assert."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.05) -> T:
    """Poll `probe` until it returns something true and return that; fail naming `what`
    (and the last value seen) once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, (
            f"{what}: not within {timeout:g} s (last: {value!r:.200})"
        )
        time.sleep(interval)
    return value
