"""Thin mode: run one CNI call in-process, for nodes without the daemon.

Kept import-light: the engine is imported only once we know we must run it.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run one CNI call with the engine in this process and exit with its status."""
    from cni import skel
    from meta.plugin import MetaPlugin

    sys.exit(skel.run(MetaPlugin()))
