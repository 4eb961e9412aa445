"""Device-info files (Network Plumbing WG device-info spec): where they live, how written.

A device plugin writes `<base>/dp/<resource>-<deviceID>-device.json` (`/` -> `-`) at
Allocate; the meta-plugin copies it per attachment (see meta/deviceinfo.py). Both sides
use the paths and the atomic, read-only write defined here.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

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
    partial = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o444)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(partial, target)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
