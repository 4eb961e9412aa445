"""The daemon's whereabouts (meta/daemon/ipam.py) loads its IPAM only with its first use."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_daemons_ipam_module_loads_no_ipam() -> None:
    code = (
        "import meta.daemon.ipam, json, sys\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('delegates.ipam'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded == [
        "delegates.ipam",
        "delegates.ipam.whereabouts",
        "delegates.ipam.whereabouts.labels",
    ]
