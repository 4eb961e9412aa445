"""Device-info files (Network Plumbing WG device-info spec): where they live, how written.

A device plugin writes `<base>/dp/<resource>-<deviceID>-device.json` (`/` -> `-`) at
Allocate; the meta-plugin copies it per attachment (see meta/deviceinfo.py). Both sides
use the paths and the atomic, read-only write defined here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cni.fileio import write_atomic

DEFAULT_DIR = "/var/run/k8s.cni.cncf.io/devinfo"
SPEC_VERSION = "1.1.0"


def dp_path(base: str, resource: str, device_id: str) -> Path:
    """Where the device plugin leaves the device-info of one device."""
    name = f"{resource.replace('/', '-')}-{device_id.replace('/', '-')}-device.json"
    return Path(base) / "dp" / name


def write(path: str | Path, info: dict[str, Any]) -> None:
    """Write `info` as JSON, atomically, mode 0444 (a file already holding exactly that
    is left alone); raises OSError."""
    target = Path(path)
    data = json.dumps(info, separators=(",", ":")).encode()
    try:
        if target.read_bytes() == data:
            return
    except FileNotFoundError:
        target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, data, 0o444)
