"""Prepare/Unprepare (deviceplugin/dra/prepare.py) on a FAKE sysfs, through the DRA gRPC
server on real unix sockets, both API versions.

The claim's GET from the API is covered by the cluster tier (tests/cluster/test_dra.py);
here a claim is planned from its JSON, and a claim already in the on-disk state is
prepared again without the API, as after a restart of the plugin.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from deviceplugin.dra import bind
from deviceplugin.dra.prepare import ClaimRef, PoolDevice, PrepareError, Preparer
from deviceplugin.dra.server import DraServer
from deviceplugin.dra.state import PreparedState
from deviceplugin.kubelet import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from deviceplugin.kubelet import pluginregistration_pb2 as reg_pb
from deviceplugin.kubelet import pluginregistration_pb2_grpc as reg_grpc
from deviceplugin.sysfs import discover
from kube.api import KubeAPI
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

DRIVER = "sriov.plexus.io"
POOL = "node-a/intel.com/sriov"
UID = "5f2c8a8e-0000-4000-8000-000000000001"
REF = ClaimRef("ns", UID, "claim")
Json = dict[str, Any]


@pytest.fixture
def preparer(fake_sysfs: FakeSysfs, tmp_path: Path) -> Preparer:
    fake_sysfs.add_pf("0000:03:00.0", "ens1f0")
    fake_sysfs.add_vf("0000:03:00.0", 0, "0000:03:10.0", netdev="ens1f0v0")
    fake_sysfs.add_vf("0000:03:00.0", 1, "0000:03:10.1", driver="vfio-pci", iommu_group=42)
    uio = fake_sysfs.add_vf("0000:03:00.0", 2, "0000:03:10.2", driver="igb_uio")
    (uio / "uio" / "uio3").mkdir(parents=True)
    (tmp_path / "dev" / "vfio").mkdir(parents=True)
    (tmp_path / "dev" / "vfio" / "42").touch()
    # The API is never reached in these tests: each claim is planned from JSON or on disk.
    no_api = cast(KubeAPI, None)
    prep = Preparer(
        no_api,
        PreparedState(tmp_path / "state"),
        tmp_path / "cdi",
        fake_sysfs.root,
        tmp_path / "dev",
    )
    vfs = {d.address: d for d in discover(fake_sysfs.root) if d.is_vf}
    prep.set_devices(
        {
            POOL: {
                f"vf-0000-03-10-{i}": PoolDevice("intel.com/sriov", vfs[f"0000:03:10.{i}"])
                for i in (0, 1, 2)
            }
        }
    )
    return prep


def claim(*devices: str, config: list[Json] | None = None, reserved: bool = True) -> Json:
    return {
        "metadata": {"uid": UID},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "vf", "driver": DRIVER, "pool": POOL, "device": d}
                        for d in devices
                    ]
                    + [{"request": "gpu", "driver": "gpu.example.com", "pool": "p", "device": "g"}],
                    "config": config or [],
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}] if reserved else [],
        },
    }


def test_plan_refuses_claims_that_are_not_ready_or_not_ours(preparer: Preparer) -> None:
    with pytest.raises(PrepareError, match="claim ns/claim: not allocated"):
        preparer.plan(REF, {"metadata": {"uid": UID}, "status": {}})
    with pytest.raises(PrepareError, match="reserved for no one"):
        preparer.plan(REF, claim("vf-0000-03-10-0", reserved=False))
    with pytest.raises(
        PrepareError, match=r"device node-a/intel\.com/sriov/vf-9 is not on this node"
    ):
        preparer.plan(REF, claim("vf-9"))


def test_prepare_writes_cdi_and_state_and_unprepare_removes_them(
    preparer: Preparer, tmp_path: Path
) -> None:
    planned = preparer.plan(REF, claim("vf-0000-03-10-0", "vf-0000-03-10-1"))
    preparer.state.put(planned)  # as prepare() does after the claim's GET
    prepared = preparer.prepare(REF)
    assert prepared == planned
    assert [(d.device, d.address, d.driver) for d in prepared.devices] == [
        ("vf-0000-03-10-0", "0000:03:10.0", "iavf"),
        ("vf-0000-03-10-1", "0000:03:10.1", "vfio-pci"),
    ]
    spec = json.loads(Path(prepared.cdi_spec).read_text())
    assert spec["kind"] == "sriov.plexus.io/vf" and spec["cdiVersion"] == "0.5.0"
    env = "PCIDEVICE_INTEL_COM_SRIOV=0000:03:10.0,0000:03:10.1"
    assert spec["devices"] == [
        {"name": f"{UID}-vf-0000-03-10-0", "containerEdits": {"env": [env], "deviceNodes": []}},
        {
            "name": f"{UID}-vf-0000-03-10-1",
            "containerEdits": {
                "env": [env],
                "deviceNodes": [
                    {"path": str(tmp_path / "dev/vfio/vfio")},
                    {"path": str(tmp_path / "dev/vfio/42")},
                ],
            },
        },
    ]
    preparer.unprepare(UID)
    assert not Path(prepared.cdi_spec).exists()
    assert preparer.state.get(UID) is None
    preparer.unprepare(UID)  # again: nothing left to undo


def test_opaque_config_rebinds_and_unprepare_restores(
    preparer: Preparer, fake_sysfs: FakeSysfs
) -> None:
    config = [{"source": "FromClaim", "requests": ["vf"],
               "opaque": {"driver": DRIVER, "parameters": {"driver": "vfio-pci"}}}]  # fmt: skip
    planned = preparer.plan(REF, claim("vf-0000-03-10-0", config=config))
    (device,) = planned.devices
    assert (device.driver_before, device.driver) == ("iavf", "vfio-pci")
    preparer.state.put(planned)
    preparer.prepare(REF)
    vf = fake_sysfs.root / "bus/pci/devices/0000:03:10.0"
    # The FAKE tree only records the writes (no kernel moves the driver link).
    assert (vf / "driver_override").read_text() == "vfio-pci"
    assert (vf / "driver" / "unbind").read_text() == "0000:03:10.0"
    assert (fake_sysfs.root / "bus/pci/drivers_probe").read_text() == "0000:03:10.0"
    # What the kernel's probe would have done: vfio-pci took it.
    vfio = fake_sysfs.root / "bus/pci/drivers/vfio-pci"  # the other VF's driver: there
    (vf / "driver").unlink()
    (vf / "driver").symlink_to(os.path.relpath(vfio, vf.resolve()))
    preparer.unprepare(UID)
    assert (vf / "driver_override").read_text() == "\n"  # cleared: the kernel picks iavf
    assert (vfio / "unbind").read_text() == "0000:03:10.0"


def test_a_uio_vf_gets_its_uio_node_or_a_clear_error(
    preparer: Preparer, fake_sysfs: FakeSysfs, tmp_path: Path
) -> None:
    preparer.state.put(preparer.plan(REF, claim("vf-0000-03-10-2")))
    spec = json.loads(Path(preparer.prepare(REF).cdi_spec).read_text())
    (device,) = spec["devices"]
    assert device["containerEdits"]["deviceNodes"] == [{"path": str(tmp_path / "dev/uio3")}]
    preparer.unprepare(UID)
    (fake_sysfs.root / "bus/pci/devices/0000:03:10.2/uio/uio3").rmdir()
    preparer.state.put(preparer.plan(REF, claim("vf-0000-03-10-2")))
    with pytest.raises(PrepareError, match=r"0000:03:10\.2: bound to igb_uio but has no uio node"):
        preparer.prepare(REF)


def test_netdevice_rebinds_a_vf_left_on_a_userspace_driver(
    preparer: Preparer, fake_sysfs: FakeSysfs
) -> None:
    config = [{"source": "FromClaim", "requests": ["vf"],
               "opaque": {"driver": DRIVER, "parameters": {"driver": "netdevice"}}}]  # fmt: skip
    preparer.state.put(preparer.plan(REF, claim("vf-0000-03-10-1", config=config)))
    preparer.prepare(REF)
    vf = fake_sysfs.root / "bus/pci/devices/0000:03:10.1"
    # The FAKE tree records the writes: override cleared so the kernel picks its driver.
    assert (vf / "driver_override").read_text() == "\n"
    assert (vf / "driver" / "unbind").read_text() == "0000:03:10.1"
    assert (fake_sysfs.root / "bus/pci/drivers_probe").read_text() == "0000:03:10.1"


def test_bind_is_a_no_op_when_the_driver_is_already_there(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_pf("0000:03:00.0", "ens1f0")
    vf = fake_sysfs.add_vf("0000:03:00.0", 0, "0000:03:10.0", driver="vfio-pci")
    bind.bind(fake_sysfs.root, "0000:03:10.0", "vfio-pci")
    bind.bind(fake_sysfs.root, "0000:03:10.0", bind.NETDEVICE, native="vfio-pci")
    assert not (vf / "driver_override").exists()
    os.chmod(vf, 0o555)
    try:
        if os.geteuid() != 0:  # root writes anyway
            with pytest.raises(bind.BindError, match=r"binding 0000:03:10\.0 to iavf: writing"):
                bind.bind(fake_sysfs.root, "0000:03:10.0", "iavf")
    finally:
        os.chmod(vf, 0o755)


@pytest.fixture
def server(preparer: Preparer, tmp_path: Path) -> Iterator[DraServer]:
    srv = DraServer(preparer, tmp_path / "registry", tmp_path / "plugins")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_registration_names_the_driver_endpoint_and_both_versions(server: DraServer) -> None:
    with grpc.insecure_channel(f"unix://{server.registration_socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        info = stub.GetInfo(reg_pb.InfoRequest(), timeout=5)
        stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True), timeout=5)
    assert (info.type, info.name, info.endpoint) == (
        "DRAPlugin",
        DRIVER,
        str(server.service_socket),
    )
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert server.registered.is_set()
    assert server.registration_socket.name.startswith(f"{DRIVER}-")  # unique per instance
    other = DraServer(server.preparer, server.registration_socket.parent, Path("/nonexistent"))
    assert other.registration_socket != server.registration_socket


@pytest.mark.parametrize(
    ("pb", "pb_grpc"), [(dra_v1_pb2, dra_v1_pb2_grpc), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)]
)
def test_both_service_versions_prepare_and_unprepare(
    server: DraServer, preparer: Preparer, pb: Any, pb_grpc: Any
) -> None:
    preparer.state.put(preparer.plan(REF, claim("vf-0000-03-10-0")))
    missing = ClaimRef("ns", "5f2c8a8e-0000-4000-8000-000000000002", "gone")
    preparer.api = cast(KubeAPI, _Unreachable())
    with grpc.insecure_channel(f"unix://{server.service_socket}") as channel:
        stub = pb_grpc.DRAPluginStub(channel)
        claims = [pb.Claim(namespace="ns", uid=UID, name="claim"),
                  pb.Claim(namespace="ns", uid=missing.uid, name="gone")]  # fmt: skip
        done = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims), timeout=5)
        ok, failed = done.claims[UID], done.claims[missing.uid]
        assert ok.error == ""
        (device,) = ok.devices
        assert (list(device.request_names), device.pool_name, device.device_name) == (
            ["vf"],
            POOL,
            "vf-0000-03-10-0",
        )
        assert list(device.cdi_device_ids) == [f"sriov.plexus.io/vf={UID}-vf-0000-03-10-0"]
        assert failed.error == "claim ns/gone: API unreachable here" and not failed.devices
        undone = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=claims), timeout=5
        )
        assert {uid: r.error for uid, r in undone.claims.items()} == {UID: "", missing.uid: ""}
    assert list(preparer.state.directory.iterdir()) == []


class _Unreachable:
    """Stands in for an API server that cannot be reached (the claim is not on disk)."""

    def request(self, method: str, path: str, *args: Any, **kw: Any) -> Json:
        raise ConnectionError("API unreachable here")
