"""Device-info files (Network Plumbing WG device-info spec): where they live, how written.

A device plugin writes `<base>/dp/<resource>-<deviceID>-device.json` (`/` -> `-`) at
Allocate; the meta-plugin copies it per attachment (see meta/deviceinfo.py). Both sides
use the paths and the atomic, read-only write defined here.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_DIR = "/var/run/k8s.cni.cncf.io/devinfo"
SPEC_VERSION = "1.1.0"


def dp_path(base: str, resource: str, device_id: str) -> Path:
    """Where the device plugin leaves the device-info of one device."""
    name = f"{resource.replace('/', '-')}-{device_id.replace('/', '-')}-device.json"
    return Path(base) / "dp" / name


def write(path: str | Path, info: dict[str, Any]) -> None:
    """Write `info` as JSON, atomically, mode 0444; raises OSError."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(info, out, separators=(",", ":"))
        os.chmod(partial, 0o444)
        os.replace(partial, target)
    except OSError:
        Path(partial).unlink(missing_ok=True)
        raise
