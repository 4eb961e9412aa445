"""CDI specs for prepared claims: one JSON file per claim, kind `sriov.plexus.io/vf`.

Each VF of a claim is one CDI device `<claim uid>-<device name>` whose container edits
set `PCIDEVICE_<RESOURCE>` (as Allocate does: the PCI addresses of the claim's VFs of
that resource in that request, comma-separated, so every device of the request sets the
same value) and add the VF's device nodes: `/dev/vfio/vfio` and its group node for
vfio-pci, its `/dev/uioN` for a uio driver.
The runtime reads the spec dir (`/var/run/cdi`) when it creates the container.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cni.fileio import write_atomic

KIND = "sriov.plexus.io/vf"
CDI_VERSION = "0.5.0"  # env and device nodes need 0.3.0; containerd's CDI reads 0.5.0
DEFAULT_DIR = "/var/run/cdi"


@dataclass(frozen=True)
class CdiDevice:
    name: str
    env: dict[str, str]
    device_nodes: tuple[str, ...] = ()

    @property
    def cdi_id(self) -> str:
        return f"{KIND}={self.name}"


def spec_path(directory: Path, claim_uid: str) -> Path:
    return directory / f"sriov.plexus.io-claim_{claim_uid}.json"


def spec(devices: Sequence[CdiDevice]) -> dict[str, object]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [
            {
                "name": d.name,
                "containerEdits": {
                    "env": [f"{k}={v}" for k, v in sorted(d.env.items())],
                    "deviceNodes": [{"path": p} for p in d.device_nodes],
                },
            }
            for d in devices
        ],
    }


def write_spec(path: Path, devices: Sequence[CdiDevice]) -> bool:
    """Write (atomically) the spec of one claim's devices; False if it already held that.
    The caller makes it durable (cni.fileio.make_durable), with the state beside it."""
    data = json.dumps(spec(devices), indent=1).encode()
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data, 0o644)
    return True


def remove_spec(path: Path) -> None:
    path.unlink(missing_ok=True)
