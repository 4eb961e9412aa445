"""The device plugin's gRPC servers, driven over their unix sockets like the kubelet does,
on a FAKE sysfs tree, registering with a FAKE kubelet registration service."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from deviceplugin.config import parse_config
from deviceplugin.kubelet import deviceplugin_pb2 as pb
from deviceplugin.kubelet import pluginregistration_pb2 as reg_pb
from deviceplugin.kubelet import pluginregistration_pb2_grpc as reg_grpc
from deviceplugin.plugin import DevicePluginRunner, PluginOptions, socket_name
from deviceplugin.server import HostPaths, ServeError
from tests.kubelet import devices, next_until, plugin_stub, serve_registration
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

PF0, PF1 = "0000:3b:00.0", "0000:af:00.0"
VF0 = [f"0000:3b:02.{i}" for i in range(3)]
VF1 = ["0000:af:02.0"]
CONFIG = {
    "resourceList": [
        {"resourceName": "vf_a", "selectors": [{"pfNames": ["ens1f0"]}]},
        {
            "resourceName": "vf_b",
            "resourcePrefix": "example.org",
            "excludeTopology": True,
            "selectors": [{"pfNames": ["ens2f0"]}],
        },
    ]
}
RES_A, RES_B = "intel.com/vf_a", "example.org/vf_b"


@pytest.fixture
def host(fake_sysfs: FakeSysfs) -> FakeSysfs:
    fake_sysfs.add_pf(PF0, "ens1f0")
    for i, addr in enumerate(VF0):
        fake_sysfs.add_vf(PF0, i, addr, netdev=f"ens1f0v{i}")
    fake_sysfs.add_pf(PF1, "ens2f0", numa_node=1)
    fake_sysfs.add_vf(PF1, 0, VF1[0], numa_node=1)
    return fake_sysfs


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    """The kubelet's two plugin dirs, under a short path (unix socket paths are short)."""
    base = Path(tempfile.mkdtemp(prefix="pxdp-"))
    plugins, registry = base / "device-plugins", base / "plugins_registry"
    plugins.mkdir()
    registry.mkdir()
    yield plugins, registry
    shutil.rmtree(base)


@contextmanager
def running(host: FakeSysfs, dirs: tuple[Path, Path], **kw: object) -> Iterator[DevicePluginRunner]:
    plugins, registry = dirs
    options = PluginOptions(
        paths=HostPaths(str(host.root), "/dev", str(plugins.parent / "devinfo")),
        plugins_dir=plugins,
        registry_dir=registry,
        **kw,  # type: ignore[arg-type]
    )
    runner = DevicePluginRunner(parse_config(json.dumps(CONFIG)), options)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop()
        thread.join(10)
        assert not thread.is_alive()


def test_registers_each_resource_and_lists_its_devices(
    host: FakeSysfs, dirs: tuple[Path, Path]
) -> None:
    plugins = dirs[0]
    with serve_registration(plugins / "kubelet.sock") as kubelet, running(host, dirs):
        requests = {r.resource_name: r for r in kubelet.wait_for(2)}
        assert set(requests) == {RES_A, RES_B}
        for name, req in requests.items():
            assert (req.version, req.endpoint) == ("v1beta1", socket_name(name))
            assert req.options.get_preferred_allocation_available
            assert not req.options.pre_start_required
        with plugin_stub(plugins / socket_name(RES_A)) as stub:
            opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
            assert opts.get_preferred_allocation_available and not opts.pre_start_required
            first = next(stub.ListAndWatch(pb.Empty(), timeout=10))
            assert devices(first) == {a: ("Healthy", [0]) for a in VF0}
        with plugin_stub(plugins / socket_name(RES_B)) as stub:
            first = next(stub.ListAndWatch(pb.Empty(), timeout=10))
            assert devices(first) == {VF1[0]: ("Healthy", [])}  # excludeTopology


def test_health_and_pool_changes_are_streamed(host: FakeSysfs, dirs: tuple[Path, Path]) -> None:
    plugins = dirs[0]
    with serve_registration(plugins / "kubelet.sock") as kubelet, running(host, dirs) as runner:
        kubelet.wait_for(2)
        with plugin_stub(plugins / socket_name(RES_A)) as stub:
            stream = stub.ListAndWatch(pb.Empty(), timeout=30)
            next(stream)
            (host.dev_dir(PF0) / "net" / "ens1f0" / "operstate").write_text("down\n")
            runner.wake()  # the FAKE tree makes no kernel events; the real ones: netns tier
            assert next_until(stream, lambda d: d[VF0[0]][0] == "Unhealthy") == {
                a: ("Unhealthy", [0]) for a in VF0
            }
            (host.dev_dir(PF0) / "net" / "ens1f0" / "operstate").write_text("up\n")
            (host.dev_dir(VF0[1]) / "driver").unlink()  # unbound from its driver
            runner.wake()
            found = next_until(stream, lambda d: d[VF0[0]][0] == "Healthy")
            assert found[VF0[1]] == ("Unhealthy", [0])
            (host.bus / VF0[2]).unlink()  # the VF is gone (sriov_numvfs lowered)
            runner.wake()
            assert set(next_until(stream, lambda d: VF0[2] not in d)) == set(VF0[:2])


def test_allocate_and_preferred_allocation(host: FakeSysfs, dirs: tuple[Path, Path]) -> None:
    plugins = dirs[0]
    with serve_registration(plugins / "kubelet.sock") as kubelet, running(host, dirs):
        kubelet.wait_for(2)
        with plugin_stub(plugins / socket_name(RES_A)) as stub:
            resp = stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=[VF0[0]]),
                        pb.ContainerAllocateRequest(devices_ids=VF0[1:]),
                    ]
                ),
                timeout=5,
            )
            envs = [dict(c.envs) for c in resp.container_responses]
            assert [e["PCIDEVICE_INTEL_COM_VF_A"] for e in envs] == [VF0[0], ",".join(VF0[1:])]
            assert (
                plugins.parent / "devinfo" / "dp" / f"intel.com-vf_a-{VF0[0]}-device.json"
            ).exists()

            with pytest.raises(grpc.RpcError) as err:
                stub.Allocate(
                    pb.AllocateRequest(
                        container_requests=[pb.ContainerAllocateRequest(devices_ids=[VF1[0]])]
                    ),
                    timeout=5,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"intel.com/vf_a: no such device {VF1[0]}" in str(err.value.details())

            pref = stub.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=VF0,
                            must_include_deviceIDs=[VF0[2]],
                            allocation_size=2,
                        )
                    ]
                ),
                timeout=5,
            )
            assert list(pref.container_responses[0].deviceIDs) == [VF0[2], VF0[0]]


def test_kubelet_restart_means_serve_again_and_register_again(
    host: FakeSysfs, dirs: tuple[Path, Path]
) -> None:
    plugins = dirs[0]
    with running(host, dirs):
        with serve_registration(plugins / "kubelet.sock") as kubelet:
            kubelet.wait_for(2)
        # the kubelet restarts: it wipes the directory and listens again
        for entry in plugins.iterdir():
            entry.unlink()
        with serve_registration(plugins / "kubelet.sock") as kubelet:
            assert {r.resource_name for r in kubelet.wait_for(2)} == {RES_A, RES_B}
            with plugin_stub(plugins / socket_name(RES_A)) as stub:
                assert set(devices(next(stub.ListAndWatch(pb.Empty(), timeout=10)))) == set(VF0)


def test_refused_registration_is_retried(host: FakeSysfs, dirs: tuple[Path, Path]) -> None:
    plugins = dirs[0]
    with serve_registration(plugins / "kubelet.sock") as kubelet:
        kubelet.refuse = "resource name already registered"
        with running(host, dirs):
            kubelet.wait_for(0, refused=2)
            kubelet.refuse = ""
            assert {r.resource_name for r in kubelet.wait_for(2)} == {RES_A, RES_B}


def test_watcher_mode_serves_registration_on_the_plugin_socket(
    host: FakeSysfs, dirs: tuple[Path, Path]
) -> None:
    plugins, registry = dirs
    with running(host, dirs, mode="watcher") as runner:
        socket = registry / socket_name(RES_A)
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            reg = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = reg.GetInfo(reg_pb.InfoRequest(), timeout=5)
            assert (info.type, info.name, info.endpoint) == ("DevicePlugin", RES_A, str(socket))
            assert list(info.supported_versions) == ["v1beta1"]
            reg.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=True), timeout=5
            )
            assert runner.servers[0].registered.is_set()
            reg.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=False, error="version"), timeout=5
            )
            assert not runner.servers[0].registered.is_set()
        with plugin_stub(socket) as stub:
            assert set(devices(next(stub.ListAndWatch(pb.Empty(), timeout=10)))) == set(VF0)
    assert os.listdir(plugins) == [] and os.listdir(registry) == []  # sockets removed
    assert os.listdir(plugins.parent / "devinfo" / "dp") == []  # and device-info files


def test_a_socket_path_too_long_is_a_clear_error(host: FakeSysfs, tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    options = PluginOptions(paths=HostPaths(str(host.root)), plugins_dir=deep)
    runner = DevicePluginRunner(parse_config(json.dumps(CONFIG)), options)
    with pytest.raises(ServeError, match=r"intel.com/vf_a: socket path .* is over 107 bytes"):
        runner.run()
