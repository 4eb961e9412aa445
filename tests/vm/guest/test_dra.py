"""DRA on QEMU's igb VFs: Prepare/Unprepare rebinding real VFs, and a pod's claim attached
through the meta engine into a pod netns, with the claim's networkData read back from
the kernel.

No kube-apiserver runs in the VM: FakeResourceAPI is a FAKE of its resource.k8s.io/v1
endpoints (claims, slices, claim status) behind the KubeAPI interface, so Prepare's claim
GET and the engine's claim reads and status write (meta/sources/claims.py) are the real
code. The slices it serves are built by deviceplugin/dra/slices.py from the real sysfs.
Everything runs in the guest test process: no Python subprocesses (each costs seconds
under TCG).
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cni.env import CmdArgs
from deviceplugin.dra.prepare import ClaimRef, PoolDevice, Preparer
from deviceplugin.dra.slices import DRIVER, device_name, node_slices, pool_name
from deviceplugin.dra.state import PreparedState
from deviceplugin.sysfs import PciNetDevice, discover
from kube.api import APIError, KubeAPI
from meta.config import MetaConfig
from meta.plugin import MetaPlugin
from meta.selection import NETWORKS_ANNOTATION
from meta.sources.base import (
    RESOURCE_NAME_ANNOTATION,
    NetworkAttachmentDefinition,
    Pod,
    PodClaim,
)
from meta.sources.claims import GROUP_PATH, SLICE_PATH, KubeClaims
from tests.vm.guest.conftest import NumVfs, driver_of, host_netdev, rebind, sh

NODE = "vm-node"
RESOURCE = "intel.com/igb_vf"
SYSFS = Path("/sys")
PCI_DEVICES = SYSFS / "bus" / "pci" / "devices"
CNI_PATH = ("/usr/lib/cni",)  # the reference loopback plugin, the pod's default network
Json = dict[str, Any]


class FakeResourceAPI(KubeAPI):
    """FAKE API server (no kube-apiserver in the VM): GET of the claims it holds (with or
    without resourceVersion=0), LIST of its slices by driver, and server-side apply of a
    claim's status, recorded in `applied`. Anything else is a 404."""

    def __init__(self, claims: list[Json], slices: list[Json]) -> None:  # no connection
        self.claims = {_claim_path(c["metadata"]): c for c in claims}
        self.slices = slices
        self.applied: list[tuple[str, Json]] = []

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        url = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(url.query)
        if method == "GET" and url.path in self.claims:
            return self.claims[url.path]
        if method == "GET" and url.path == SLICE_PATH:
            driver = query["fieldSelector"][0].removeprefix("spec.driver=")
            return {"items": [s for s in self.slices if s["spec"]["driver"] == driver]}
        claim_path = url.path.removesuffix("/status")
        if method == "PATCH" and claim_path in self.claims and url.path.endswith("/status"):
            assert content_type == "application/apply-patch+yaml", content_type
            assert query["fieldManager"] == ["plexus"], query
            self.applied.append((claim_path, body))
            return dict(body)
        raise APIError(404, f"FakeResourceAPI has no {method} {path}")


def _claim_path(meta: Json) -> str:
    return f"{GROUP_PATH}/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"


def claim_for(pci: str, parameters: Json | None = None) -> Json:
    """A claim allocated (as the scheduler writes it) the VF `pci` of this node's pool, with
    the opaque `parameters` for our driver, reserved for a pod."""
    config = []
    if parameters is not None:
        opaque = {"driver": DRIVER, "parameters": parameters}
        config = [{"source": "FromClaim", "requests": ["vf"], "opaque": opaque}]
    result = {
        "request": "vf",
        "driver": DRIVER,
        "pool": pool_name(NODE, RESOURCE),
        "device": device_name(pci),
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "dra", "name": "vf-claim", "uid": str(uuid.uuid4())},
        "status": {
            "allocation": {"devices": {"results": [result], "config": config}},
            "reservedFor": [{"resource": "pods", "name": "pod", "uid": str(uuid.uuid4())}],
        },
    }


def pool_devices() -> list[PciNetDevice]:
    """The igb VFs as discovery sees them: the pool of RESOURCE."""
    return [d for d in discover(SYSFS) if d.is_vf and d.device == "10ca"]


def wait_for_netdev(pci: str, name: str) -> None:
    """Wait until the VF's netdev is back under `name` (udev renames it after the probe)."""
    deadline = time.monotonic() + 30
    while host_netdev(pci) != name:
        assert time.monotonic() < deadline, f"{pci}: netdev {host_netdev(pci)!r}, not {name}"
        time.sleep(0.2)


def preparer_for(tmp_path: Path, api: KubeAPI) -> Preparer:
    """A Preparer over the real sysfs and /dev, its pool what DraPlugin.update hands it."""
    prep = Preparer(api, PreparedState(tmp_path / "state"), tmp_path / "cdi", SYSFS)
    devices = {device_name(d.address): PoolDevice(RESOURCE, d) for d in pool_devices()}
    prep.set_devices({pool_name(NODE, RESOURCE): devices})
    return prep


def vfio_unusable(pci: str) -> str:
    """Why vfio-pci cannot bind the VF here ("" if it can): it needs the vfio-pci module and
    an IOMMU group, or the kernel's no-IOMMU mode."""
    if sh("modprobe", "vfio-pci", check=False).returncode != 0:
        return "the guest kernel has no vfio-pci module"
    if (PCI_DEVICES / pci / "iommu_group").exists():
        return ""
    if Path("/sys/module/vfio/parameters/enable_unsafe_noiommu_mode").exists():
        Path("/sys/module/vfio/parameters/enable_unsafe_noiommu_mode").write_text("Y")
        return ""
    return (
        "vfio-pci cannot bind: the VM has no IOMMU (QEMU's machine has none) and the guest "
        "kernel lacks CONFIG_VFIO_NOIOMMU"
    )


@pytest.mark.parametrize("driver", ["vfio-pci", "uio_pci_generic", "netdevice"])
def test_dra_prepare_binds_the_vf_and_unprepare_restores_it(
    vfs: NumVfs, tmp_path: Path, driver: str
) -> None:
    """Prepare of a claim whose opaque config names `driver` binds the real VF to it and
    writes the claim's CDI spec; Unprepare gives the VF its driver (and netdev) back.

    netdevice starts from a VF on uio_pci_generic (a DPDK driver), as a VF a previous
    workload left there: Prepare binds igbvf, Unprepare puts uio_pci_generic back.
    """
    pci, netdev = vfs[0]
    if driver == "vfio-pci":
        assert not (why := vfio_unusable(pci)), why  # tests/vm/vm.py emulates an IOMMU
    sh("modprobe", "uio_pci_generic")
    if driver == "netdevice":
        rebind(pci, "uio_pci_generic")
    before = driver_of(pci)
    claim = claim_for(pci, {"driver": driver})
    api = FakeResourceAPI([claim], [])
    prep = preparer_for(tmp_path, api)
    meta = claim["metadata"]
    ref = ClaimRef(meta["namespace"], meta["uid"], meta["name"])

    prepared = prep.prepare(ref)

    bound = "igbvf" if driver == "netdevice" else driver
    assert driver_of(pci) == bound
    (device,) = prepared.devices
    assert (device.address, device.driver_before, device.driver) == (pci, before, driver)
    spec = json.loads(Path(prepared.cdi_spec).read_text())
    (cdi_device,) = spec["devices"]
    assert f"{spec['kind']}={cdi_device['name']}" == device.cdi_id
    edits = cdi_device["containerEdits"]
    assert edits["env"] == [f"PCIDEVICE_INTEL_COM_IGB_VF={pci}"]
    nodes = [n["path"] for n in edits["deviceNodes"]]
    if driver == "vfio-pci":
        group = os.path.basename(os.readlink(PCI_DEVICES / pci / "iommu_group"))
        assert nodes[0] == "/dev/vfio/vfio" and nodes[1] in (
            f"/dev/vfio/{group}",
            f"/dev/vfio/noiommu-{group}",
        )
        assert all(os.path.exists(n) for n in nodes), nodes
    elif driver == "uio_pci_generic":
        (uio,) = os.listdir(PCI_DEVICES / pci / "uio")
        assert nodes == [f"/dev/{uio}"] and os.path.exists(nodes[0])
    else:
        assert nodes == []
    if driver == "netdevice":
        wait_for_netdev(pci, netdev)  # Prepare gave the claim a netdevice
    else:
        assert host_netdev(pci) == ""
    assert prep.prepare(ref) == prepared  # the kubelet's retry: the same answer

    prep.unprepare(ref.uid)

    assert driver_of(pci) == before
    if before == "igbvf":
        wait_for_netdev(pci, netdev)
    else:
        assert host_netdev(pci) == ""
    assert not Path(prepared.cdi_spec).exists()
    assert list((tmp_path / "state").iterdir()) == []
    assert driver_of(vfs[1][0]) == "igbvf"  # the other VF was not touched


class FakeCluster:
    """FAKE cluster source (no API server in the VM): one pod and one NAD; network-status
    and events are kept. Claims are read, and their status written, by the real
    KubeClaims (thin mode) over `api`."""

    def __init__(self, pod: Pod, nad: NetworkAttachmentDefinition, api: KubeAPI) -> None:
        self.pod, self.nad = pod, nad
        self.source = KubeClaims(api, "", 5.0, None, watch_slices=False)
        self.network_status = ""

    def get_pod(self, namespace: str, name: str, wait: bool = True) -> Pod | None:
        return self.pod if (namespace, name) == (self.pod.namespace, self.pod.name) else None

    def get_nad(self, namespace: str, name: str) -> NetworkAttachmentDefinition | None:
        return self.nad if (namespace, name) == (self.nad.namespace, self.nad.name) else None

    def set_network_status(self, pod: Pod, value: str) -> None:
        self.network_status = value

    def record_event(self, pod: Pod, type_: str, reason: str, message: str) -> None:
        pass

    def claims(self) -> KubeClaims:
        return self.source


class NoKubelet:
    """The kubelet's device IDs: never asked here, the claim names the VF."""

    def device_ids(self, namespace: str, pod: str, uid: str, resource: str) -> list[str]:
        raise AssertionError(f"asked the kubelet for {resource}: the claim was not used")


def test_dra_claim_attaches_its_vf_with_networkdata_matching_the_kernel(
    vfs: NumVfs, netns: Callable[[], str], tmp_path: Path
) -> None:
    """The engine takes the VF's deviceID from the pod's claim (allocation + the slice's
    Multus attributes), the sriov delegate moves that VF into the pod, and the claim's
    status.devices networkData is what the kernel shows in the pod; DEL gives it back."""
    pci, netdev = vfs[1]  # not the first VF: the ID must come from the slice, not by luck
    ns, ip = netns(), "10.79.0.5/24"
    claim = claim_for(pci)
    slices = list(node_slices(NODE, "vm-node-uid", {RESOURCE: pool_devices()}, {}).values())
    api = FakeResourceAPI([claim], slices)
    meta = claim["metadata"]
    pod = Pod(
        namespace=meta["namespace"],
        name="pod",
        uid=str(uuid.uuid4()),
        annotations={NETWORKS_ANNOTATION: "vf-net@net1"},
        resource_claims=[PodClaim(name="vf", claim=meta["name"])],
    )
    vf_net = {
        "cniVersion": "1.0.0",
        "name": "vf-net",
        "type": "sriov",
        "dataDir": str(tmp_path / "sriov"),
        "ipam": {"type": "static", "addresses": [{"address": ip}]},
    }
    nad = NetworkAttachmentDefinition(
        namespace=pod.namespace,
        name="vf-net",
        config=json.dumps(vf_net),
        annotations={RESOURCE_NAME_ANNOTATION: RESOURCE},
    )
    conf = MetaConfig.model_validate(
        {
            "cniVersion": "1.0.0",
            "name": "plexus",
            "type": "plexus",
            "cniDir": str(tmp_path / "cni"),
            "deviceInfoDir": str(tmp_path / "devinfo"),
            "delegates": [{"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}],
            "allowedHostPaths": [str(tmp_path)],  # the NAD's sriov dataDir
        }
    )
    cluster = FakeCluster(pod, nad, api)
    plugin = MetaPlugin(cluster, configure_logging=False, devices=NoKubelet())
    pod_args = (
        ("IgnoreUnknown", "1"),  # as runtimes send them: the delegates know no K8S_ args
        ("K8S_POD_NAMESPACE", pod.namespace),
        ("K8S_POD_NAME", pod.name),
        ("K8S_POD_UID", pod.uid),
    )

    def call(verb: str) -> CmdArgs:
        return CmdArgs(verb, "dra-c1", f"/run/netns/{ns}", "eth0", pod_args, CNI_PATH, b"")

    plugin.engine_for(conf, CNI_PATH).add(call("ADD"))

    assert host_netdev(pci) == ""
    (link,) = json.loads(sh("ip", "-j", "addr", "show", "net1", netns=ns).stdout)
    kernel_ips = [
        f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"
    ]
    assert kernel_ips == [ip]
    # `ip netns exec` mounts the pod's own /sys/class/net: this is the claim's VF
    moved = sh("readlink", "-f", "/sys/class/net/net1/device", netns=ns).stdout.strip()
    assert os.path.basename(moved) == pci
    ((path, body),) = api.applied
    assert path == _claim_path(meta)
    assert body["metadata"] == {k: meta[k] for k in ("name", "namespace", "uid")}
    (entry,) = body["status"]["devices"]
    assert (entry["driver"], entry["pool"], entry["device"]) == (
        DRIVER,
        pool_name(NODE, RESOURCE),
        device_name(pci),
    )
    assert entry["networkData"] == {
        "interfaceName": link["ifname"],
        "ips": kernel_ips,
        "hardwareAddress": link["address"],
    }
    assert entry["conditions"][0]["type"] == "Ready" and entry["conditions"][0]["status"] == "True"
    statuses = {s["interface"]: s for s in json.loads(cluster.network_status) if "interface" in s}
    assert statuses["net1"]["ips"] == [ip.split("/")[0]]

    plugin.engine_for(conf, CNI_PATH).delete(call("DEL"))

    wait_for_netdev(pci, netdev)
    assert sh("ip", "link", "show", "net1", netns=ns, check=False).returncode != 0
    assert host_netdev(vfs[0][0]) == vfs[0][1]
