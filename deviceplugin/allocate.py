"""What Allocate hands the kubelet for a container, as sriov-network-device-plugin does.

- env `PCIDEVICE_<PREFIX>_<NAME>` (upper case, `.` and `/` -> `_`): the PCI addresses,
  comma-separated, and `<that>_INFO`: a JSON object per address (`generic.deviceID`,
  `vfio`/`uio` device paths when a userspace driver holds it, `extra` from
  `additionalInfo`);
- DeviceSpecs for userspace drivers (vfio: the container and group nodes, uio: its node),
  and for `needVhostNet` `/dev/vhost-net` and `/dev/net/tun`;
- one device-info file per device (`cni.deviceinfo`), for the meta-plugin to report.
  `DeviceInfoFiles` writes them as devices enter the pool, so Allocate finds them
  current (a read) instead of creating files on the pod's start-up path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cni import deviceinfo
from deviceplugin.config import ResourceConfig
from deviceplugin.kubelet import deviceplugin_pb2 as pb
from deviceplugin.sysfs import UIO_DRIVERS, VFIO_DRIVERS, PciNetDevice, device_dir

log = logging.getLogger("plexus.deviceplugin")

RW = "mrw"


class AllocationError(ValueError):
    """A device ID the kubelet asked for is not in the pool (or cannot be served)."""


def env_name(resource: str) -> str:
    """`intel.com/sriov_a` -> `PCIDEVICE_INTEL_COM_SRIOV_A`."""
    return "PCIDEVICE_" + resource.upper().replace(".", "_").replace("/", "_").replace("-", "_")


def vfio_nodes(dev: PciNetDevice, dev_root: Path) -> tuple[str, str]:
    """(/dev/vfio/vfio, the group node); no-IOMMU mode names the group `noiommu-N`."""
    group = dev.iommu_group or ""
    node = dev_root / "vfio" / group
    if not node.exists() and (dev_root / "vfio" / f"noiommu-{group}").exists():
        node = dev_root / "vfio" / f"noiommu-{group}"
    return str(dev_root / "vfio" / "vfio"), str(node)


def uio_node(dev: PciNetDevice, sysfs_root: Path, dev_root: Path) -> str:
    """The VF's /dev/uioN ("" if its uio driver made none)."""
    uio = device_dir(dev.address, sysfs_root) / "uio"
    names = sorted(os.listdir(uio)) if uio.is_dir() else []
    return str(dev_root / names[0]) if names else ""


def _spec(path: str) -> pb.DeviceSpec:
    return pb.DeviceSpec(container_path=path, host_path=path, permissions=RW)


def _device_specs_and_info(
    dev: PciNetDevice, sysfs_root: Path, dev_root: Path
) -> tuple[list[pb.DeviceSpec], dict[str, Any]]:
    info: dict[str, Any] = {"generic": {"deviceID": dev.address}}
    if dev.driver in VFIO_DRIVERS:
        container, group = vfio_nodes(dev, dev_root)
        info["vfio"] = {"mount": container, "dev-mount": group}
        return [_spec(container), _spec(group)], info
    if dev.driver in UIO_DRIVERS:
        node = uio_node(dev, sysfs_root, dev_root)
        if not node:
            raise AllocationError(f"{dev.address}: bound to {dev.driver} but has no uio node")
        info["uio"] = {"dev-mount": node}
        return [_spec(node)], info
    return [], info


def device_info(dev: PciNetDevice) -> dict[str, Any]:
    """The device-info object (spec 1.1.0) of one allocated device."""
    pci: dict[str, str] = {"pci-address": dev.address}
    if dev.pf_address:
        pci["pf-pci-address"] = dev.pf_address
    if dev.rdma:
        pci["rdma-device"] = ",".join(dev.rdma)
    return {"type": "pci", "version": deviceinfo.SPEC_VERSION, "pci": pci}


class DeviceInfoFiles:
    """One resource's device-info files, kept in step with its pool; removed on `clear`."""

    def __init__(self, resource: str, directory: str) -> None:
        self.resource = resource
        self.directory = directory
        self._written: dict[str, dict[str, Any]] = {}

    def sync(self, pool: Mapping[str, PciNetDevice]) -> None:
        """Write the files of new or changed devices, remove those of departed ones."""
        for device_id in set(self._written) - set(pool):
            self._remove(device_id)
        for device_id, dev in pool.items():
            info = device_info(dev)
            if self._written.get(device_id) != info:
                try:
                    deviceinfo.write(self._path(device_id), info)
                except OSError as exc:  # Allocate writes it again, or says why it cannot
                    log.warning("device-info file for %s not written: %s", device_id, exc)
                    continue
                self._written[device_id] = info

    def clear(self) -> None:
        for device_id in list(self._written):
            self._remove(device_id)

    def _path(self, device_id: str) -> Path:
        return deviceinfo.dp_path(self.directory, self.resource, device_id)

    def _remove(self, device_id: str) -> None:
        self._written.pop(device_id, None)
        with contextlib.suppress(OSError):
            self._path(device_id).unlink(missing_ok=True)


def container_response(
    resource: ResourceConfig,
    device_ids: list[str],
    pool: Mapping[str, PciNetDevice],
    *,
    sysfs_root: str | Path,
    dev_root: str | Path = "/dev",
    devinfo_dir: str = deviceinfo.DEFAULT_DIR,
) -> pb.ContainerAllocateResponse:
    """The response for one container; raises AllocationError for an ID not in `pool`."""
    unknown = [i for i in device_ids if i not in pool]
    if unknown:
        raise AllocationError(f"{resource.full_name}: no such device {', '.join(unknown)}")
    specs: dict[str, pb.DeviceSpec] = {}
    infos: dict[str, Any] = {}
    for device_id in device_ids:
        dev = pool[device_id]
        dev_specs, info = _device_specs_and_info(dev, Path(sysfs_root), Path(dev_root))
        extra = {
            **resource.additional_info.get("*", {}),
            **resource.additional_info.get(device_id, {}),
        }
        if extra:
            info["extra"] = extra
        infos[device_id] = info
        for spec in dev_specs:
            specs[spec.host_path] = spec
        try:
            deviceinfo.write(
                deviceinfo.dp_path(devinfo_dir, resource.full_name, device_id), device_info(dev)
            )
        except OSError as exc:
            raise AllocationError(f"{device_id}: cannot write its device-info file: {exc}") from exc
    if any(sel.need_vhost_net for sel in resource.selectors):
        for node in ("vhost-net", "net/tun"):
            path = str(Path(dev_root) / node)
            specs[path] = _spec(path)
    name = env_name(resource.full_name)
    envs = {name: ",".join(device_ids), f"{name}_INFO": json.dumps(infos, separators=(",", ":"))}
    return pb.ContainerAllocateResponse(envs=envs, devices=list(specs.values()))
