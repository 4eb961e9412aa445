"""The DRA kubelet plugin as one part of the device plugin process.

The runner's discovery hands every scan's pools of the DRA resources to `update`: the
healthy VFs are published as ResourceSlices (publish.py), and all of them are what
Prepare may hand out (prepare.py) and get device-info files, as the device plugin's VFs
do (the meta-plugin reports them in network-status); `start` begins serving the kubelet
(server.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cni import deviceinfo
from deviceplugin.allocate import DeviceInfoFiles
from deviceplugin.dra.claims import ClaimCache
from deviceplugin.dra.prepare import PoolDevice, Preparer
from deviceplugin.dra.publish import SlicePublisher
from deviceplugin.dra.server import DraServer
from deviceplugin.dra.slices import device_name, pool_name
from deviceplugin.dra.state import PreparedState
from deviceplugin.sysfs import PciNetDevice
from kube.api import KubeAPI

KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"


@dataclass(frozen=True)
class DraOptions:
    node_name: str
    resources: frozenset[str]  # full resource names served through DRA ("*": all)
    kubeconfig: str = ""  # "" = in-cluster
    kubelet_plugins_dir: Path = Path(KUBELET_PLUGINS_DIR)
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path = Path("/var/lib/plexus/dra")
    devinfo_dir: str = deviceinfo.DEFAULT_DIR
    resync_seconds: float = 30.0

    def serves(self, resource: str) -> bool:
        return "*" in self.resources or resource in self.resources


class DraPlugin:
    """Slices, Prepare/Unprepare and the kubelet's gRPC server of one node."""

    def __init__(
        self, options: DraOptions, registry_dir: Path, sysfs_root: Path, dev_root: Path
    ) -> None:
        self.options = options
        api = KubeAPI(options.kubeconfig)
        self.publisher = SlicePublisher(api, options.node_name, options.resync_seconds)
        self.claims = ClaimCache(api, options.node_name)
        self.preparer = Preparer(
            api,
            PreparedState(options.state_dir),
            options.cdi_dir,
            sysfs_root,
            dev_root,
            self.claims,
        )
        self.server = DraServer(self.preparer, registry_dir, options.kubelet_plugins_dir)
        # Never cleared on stop: an upgraded instance may already serve the same VFs.
        self._files: dict[str, DeviceInfoFiles] = {}

    def update(
        self, pools: Mapping[str, Sequence[PciNetDevice]], health: Mapping[str, bool]
    ) -> None:
        """This scan's pools (resource -> VFs) and health (address -> healthy)."""
        node = self.options.node_name
        self.preparer.set_devices(
            {
                pool_name(node, resource): {
                    device_name(d.address): PoolDevice(resource, d) for d in devices
                }
                for resource, devices in pools.items()
            }
        )
        for resource, devices in pools.items():
            files = self._files.setdefault(
                resource, DeviceInfoFiles(resource, self.options.devinfo_dir)
            )
            files.sync({d.address: d for d in devices})
        self.publisher.set_pools(
            {r: [d for d in devices if health.get(d.address)] for r, devices in pools.items()}
        )

    def start(self) -> None:
        self.claims.start()
        self.publisher.start()
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        self.publisher.stop()
        self.claims.stop()
