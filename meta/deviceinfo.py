"""Device-info files (Network Plumbing WG device-info spec), as Multus handles them.

A device plugin writes `<base>/dp/<resource>-<deviceID>-device.json` (`/` -> `-`).
Before a network with a device is attached, it is copied to the network's CNI file
`<base>/cni/<config name>-<containerID>_<ifname>` (also passed to the delegate as the
`CNIDeviceInfoFile` capability); after ADD that file goes into network-status as
`device-info`, and DEL removes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cni import jsonio
from cni.deviceinfo import dp_path, write
from cni.errors import CNIError, ErrorCode
from cni.fileio import name_problem

CAPABILITY = "CNIDeviceInfoFile"


def cni_path(base: str, network: str, container_id: str, ifname: str) -> Path:
    """The per-attachment copy; `network` is the delegate config's `name`. CNIError
    (INVALID_CONFIG) if the name would be too long for a file name."""
    name = f"{network}-{container_id}_{ifname}".replace("/", "-")
    if problem := name_problem(name):
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"network name {network!r} is too long to name the device-info file of "
            f"container {container_id} ({problem} with the container ID and ifname)",
        )
    return Path(base) / "cni" / name


def load(path: str | Path) -> dict[str, Any] | None:
    """A device-info object, or None if the file does not exist."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CNIError(ErrorCode.IO_FAILURE, f"cannot read device-info {path}", str(exc)) from exc
    info = jsonio.loads(text, f"device-info {path}")
    if not isinstance(info, dict):
        raise CNIError(ErrorCode.DECODE_FAILURE, f"device-info {path} is not a JSON object")
    return info


def copy_from_dp(base: str, resource: str, device_id: str, dest: str | Path) -> bool:
    """Copy the device plugin's file to `dest` (mode 0444); False if the plugin wrote none."""
    info = load(dp_path(base, resource, device_id))
    if info is None:
        return False
    try:
        write(dest, info)
    except OSError as exc:
        raise CNIError(ErrorCode.IO_FAILURE, f"cannot write device-info {dest}", str(exc)) from exc
    return True


def clean(base: str, path: str | Path) -> None:
    """Remove a CNI device-info file; only files under `<base>/cni/` are ever removed."""
    target = Path(os.path.abspath(path))
    if target.parent != Path(os.path.abspath(base)) / "cni":
        return
    try:
        target.unlink(missing_ok=True)
    except OSError as exc:
        raise CNIError(
            ErrorCode.IO_FAILURE, f"cannot remove device-info {target}", str(exc)
        ) from exc
