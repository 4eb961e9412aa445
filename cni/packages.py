"""Importing a library's submodules without running its package `__init__`."""

from __future__ import annotations

import importlib.util
import sys


def skip_package_init(name: str) -> None:
    """Put an empty module for package `name` in sys.modules, so `name.sub` imports run
    only the submodules asked for (and what they import), not `name/__init__.py`.

    For libraries whose `__init__` re-exports their whole API at a memory cost the caller
    does not need (docs/performance.md). A package already imported is left as it is.
    """
    if name not in sys.modules:
        spec = importlib.util.find_spec(name)
        if spec is not None:
            sys.modules[name] = importlib.util.module_from_spec(spec)
