"""What the container runtime execs as the `plexus` CNI plugin.

Kept import-light: the engine is imported only once we know we must run it.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run one CNI call in-process (thin mode) and exit with its status."""
    from cni import skel
    from meta.plugin import MetaPlugin

    sys.exit(skel.run(MetaPlugin()))
