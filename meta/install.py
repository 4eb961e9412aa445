"""`plexus install-cni`: put the CNI binaries where a runtime looks for them."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

# Each installed binary: its name and the module whose main() it runs.
BINARIES = {"plexus": "meta.shim"}

_TEMPLATE = """#!{python} -I
# Installed by `plexus install-cni`; runs Plexus from {prefix}.
from {module} import main

main()
"""


def install_binaries(bin_dir: str | Path) -> list[Path]:
    """Write each binary atomically into `bin_dir` (mode 0755); return their paths."""
    target = Path(bin_dir)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, module in BINARIES.items():
        text = _TEMPLATE.format(python=sys.executable, prefix=sys.prefix, module=module)
        fd, tmp = tempfile.mkstemp(dir=target, prefix=f".{name}-")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target / name)
        written.append(target / name)
    return written
