"""The sriov plugin on QEMU's igb: real VFs, configured through the PF, moved into pods.

Runs in the VM tier only (the host kernel has no SR-IOV). Each test enables two VFs on
the igb PF (the `igb_pf` fixture removes them after) and drives the plugin in process
through cni.skel.dispatch, the way BuiltinExecutor runs it. PF-side state is read back
with `ip -d -j link show <pf>`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni.errors import CNIError
from deviceplugin.allocate import container_response
from deviceplugin.config import ResourceConfig
from deviceplugin.selectors import healthy
from deviceplugin.sysfs import discover
from tests.vm.guest.conftest import (
    NumVfs,
    Pf,
    driver_of,
    host_netdev,
    rebind,
    sh,
    sriov_call,
    sriov_conf,
)


def _vfinfo(pf: Pf, vf: int) -> dict[str, Any]:
    links = json.loads(sh("ip", "-d", "-j", "link", "show", pf.netdev).stdout)
    for info in links[0].get("vfinfo_list", []):
        if info.get("vf") == vf:
            info.pop("stats", None)
            return dict(info)
    raise AssertionError(f"no vf {vf} in {links}")


def _mac(dev: str, netns: str = "") -> str:
    link = json.loads(sh("ip", "-j", "link", "show", dev, netns=netns).stdout)[0]
    return str(link["address"])


def _assert_restored(pf: Pf, vf: int, before: dict[str, Any], netdev_mac: str) -> None:
    """The PF shows VF `vf` as `before`, but for a MAC the VF driver may have reported.

    With no administrative MAC, igb shows the MAC igbvf last reported, and igbvf reports
    the netdev's own when DEL gives it back: whether the PF saw that yet depends on
    mailbox timing, so both the old value and the netdev's MAC are right.
    """
    after = _vfinfo(pf, vf)
    assert after.pop("address") in (before["address"], netdev_mac), after
    assert after == {k: v for k, v in before.items() if k != "address"}


def _static(address: str) -> dict[str, Any]:
    return {"type": "static", "addresses": [{"address": address}]}


def test_sriov_add_check_del_restores_everything(
    igb_pf: Pf, vfs: NumVfs, netns: Callable[[], str], tmp_path: Path
) -> None:
    pci, netdev = vfs[0]
    before, host_mac = _vfinfo(igb_pf, 0), _mac(netdev)
    ns = netns()
    conf = sriov_conf(
        pci,
        tmp_path,
        vlan=100,
        vlanQoS=3,
        mac="02:00:00:00:10:01",
        spoofchk="off",
        trust="on",
        max_tx_rate=100,
        ipam=_static("10.77.0.1/24"),
    )
    result = json.loads(sriov_call("ADD", conf, ns))
    assert result["interfaces"] == [
        {"name": "net1", "mac": "02:00:00:00:10:01", "sandbox": f"/run/netns/{ns}"}
    ]
    assert result["ips"] == [{"interface": 0, "address": "10.77.0.1/24"}]
    info = _vfinfo(igb_pf, 0)
    text = sh("ip", "-d", "link", "show", igb_pf.netdev).stdout
    assert info["address"] == "02:00:00:00:10:01", text
    assert info["vlan_list"][0]["vlan"] == 100 and info["vlan_list"][0]["qos"] == 3, text
    assert info["spoofchk"] is False and info["trust"] is True, text
    assert info["rate"]["max_tx"] == 100, text
    assert host_netdev(pci) == ""
    assert _mac("net1", ns) == "02:00:00:00:10:01"
    assert "10.77.0.1/24" in sh("ip", "addr", "show", "net1", netns=ns).stdout

    sriov_call("CHECK", {**conf, "prevResult": result}, ns)
    sh("ip", "link", "set", igb_pf.netdev, "vf", "0", "vlan", "101", "qos", "3")
    with pytest.raises(CNIError, match="vlan"):
        sriov_call("CHECK", {**conf, "prevResult": result}, ns)
    # a trusted VF may change its own MAC: DEL must still put everything back
    sh("ip", "link", "set", "net1", "address", "02:00:00:00:10:02", netns=ns)
    sriov_call("DEL", {**conf, "prevResult": result}, ns)

    _assert_restored(igb_pf, 0, before, host_mac)
    assert host_netdev(pci) == netdev
    assert _mac(netdev) == host_mac
    assert sh("ip", "link", "show", "net1", netns=ns, check=False).returncode != 0
    assert list(tmp_path.iterdir()) == []


def test_sriov_two_vfs_in_two_pods_ping(
    igb_pf: Pf, vfs: NumVfs, netns: Callable[[], str], tmp_path: Path
) -> None:
    pods = [netns(), netns()]
    for n, ((pci, _), ns) in enumerate(zip(vfs, pods, strict=True)):
        conf = sriov_conf(pci, tmp_path, cniVersion="1.1.0", ipam=_static(f"10.78.0.{n + 1}/24"))
        result = json.loads(sriov_call("ADD", conf, ns, cid=f"ping{n}"))
        assert result["interfaces"][0]["pciID"] == pci
    ping = sh("ping", "-c", "2", "-w", "20", "10.78.0.2", netns=pods[0], check=False)
    if ping.returncode != 0:
        state = [sh("ip", "-d", "addr", netns=ns).stdout for ns in pods]
        pf = sh("ip", "-d", "link", "show", igb_pf.netdev).stdout
        raise AssertionError(f"ping failed: {ping.stdout}\n{pf}\n" + "\n".join(state))
    for n, ((pci, netdev), ns) in enumerate(zip(vfs, pods, strict=True)):
        conf = sriov_conf(pci, tmp_path, ipam=_static(f"10.78.0.{n + 1}/24"))
        sriov_call("DEL", conf, ns, cid=f"ping{n}")
        assert host_netdev(pci) == netdev


@pytest.mark.parametrize(
    ("setting", "extra"),
    [
        ("min_tx_rate", {"min_tx_rate": 10}),
        ("link_state", {"link_state": "disable"}),
        # igb takes only 802.1Q VLANs: its "protocol not supported" shows the kernel read
        # the protocol from our IFLA_VF_VLAN_LIST
        ("vlanProto of VF 0: protocol not supported", {"vlanProto": "802.1ad"}),
    ],
)
def test_sriov_refused_setting_fails_clearly_and_changes_nothing(
    igb_pf: Pf,
    vfs: NumVfs,
    netns: Callable[[], str],
    tmp_path: Path,
    setting: str,
    extra: dict[str, Any],
) -> None:
    pci, netdev = vfs[0]
    before, host_mac = _vfinfo(igb_pf, 0), _mac(netdev)
    ns = netns()
    conf = sriov_conf(pci, tmp_path, vlan=200, mac="02:00:00:00:20:01", trust="on", **extra)
    with pytest.raises(CNIError) as info:
        sriov_call("ADD", conf, ns)
    assert setting in info.value.msg, info.value.msg
    _assert_restored(igb_pf, 0, before, host_mac)
    assert host_netdev(pci) == netdev and _mac(netdev) == host_mac
    assert not list(tmp_path.glob("*.json"))


def test_sriov_del_after_the_netns_is_gone(
    igb_pf: Pf, vfs: NumVfs, netns: Callable[[], str], tmp_path: Path
) -> None:
    pci, netdev = vfs[1]
    before, host_mac = _vfinfo(igb_pf, 1), _mac(netdev)
    ns = netns()
    conf = sriov_conf(pci, tmp_path, vlan=300, mac="02:00:00:00:30:01")
    sriov_call("ADD", conf, ns, ifname="eth7", cid="gone")
    sh("ip", "netns", "del", ns)
    sriov_call("DEL", conf, ns, ifname="eth7", cid="gone")
    assert host_netdev(pci) == netdev
    _assert_restored(igb_pf, 1, before, host_mac)
    sriov_call("DEL", conf, ns, ifname="eth7", cid="gone")  # again: nothing cached, still fine


@pytest.fixture
def dpdk_vf(vfs: NumVfs) -> Iterator[str]:
    """VF 1 bound to uio_pci_generic, a DPDK driver (vfio-pci needs an IOMMU or no-IOMMU
    mode, and neither QEMU's machine nor Debian's kernel config gives one); bound back to
    igbvf afterwards."""
    pci = vfs[1][0]
    sh("modprobe", "uio_pci_generic")
    rebind(pci, "uio_pci_generic")
    assert driver_of(pci) == "uio_pci_generic"
    yield pci
    rebind(pci, "")


def test_sriov_dpdk_vf_stays_put_and_reports_its_pci_address(
    igb_pf: Pf, dpdk_vf: str, netns: Callable[[], str], tmp_path: Path
) -> None:
    before = _vfinfo(igb_pf, 1)
    ns = netns()
    # cniVersion 1.1.0: the version whose results carry pciID
    conf = sriov_conf(dpdk_vf, tmp_path, cniVersion="1.1.0", vlan=200, spoofchk="off")
    result = json.loads(sriov_call("ADD", conf, ns))
    assert result["interfaces"] == [
        {"name": "net1", "sandbox": f"/run/netns/{ns}", "pciID": dpdk_vf}
    ]
    info = _vfinfo(igb_pf, 1)
    assert info["vlan_list"][0]["vlan"] == 200 and info["spoofchk"] is False
    assert [
        link["ifname"] for link in json.loads(sh("ip", "-j", "link", "show", netns=ns).stdout)
    ] == ["lo"]
    sriov_call("CHECK", {**conf, "prevResult": result}, ns)
    sriov_call("DEL", {**conf, "prevResult": result}, ns)
    assert _vfinfo(igb_pf, 1) == before
    assert list(tmp_path.iterdir()) == []


def test_device_plugin_allocates_a_dpdk_vf_with_its_device_node(
    igb_pf: Pf, dpdk_vf: str, tmp_path: Path
) -> None:
    resource = ResourceConfig.model_validate(
        {"resourceName": "igb_dpdk", "selectors": {"drivers": ["uio_pci_generic"]}}
    )
    deadline = time.monotonic() + 30
    while True:  # the emulated PF link may still be settling after the rebind
        devices = discover("/sys")
        by_address = {d.address: d for d in devices}
        pool = {d.address: d for d in devices if d.driver == "uio_pci_generic"}
        assert list(pool) == [dpdk_vf]
        if healthy(pool[dpdk_vf], by_address):
            break
        assert time.monotonic() < deadline, f"not healthy: {by_address[igb_pf.pci]}"
        time.sleep(0.2)
    resp = container_response(
        resource, [dpdk_vf], pool, sysfs_root="/sys", devinfo_dir=str(tmp_path)
    )
    (uio,) = os.listdir(f"/sys/bus/pci/devices/{dpdk_vf}/uio")
    assert [(d.host_path, d.permissions) for d in resp.devices] == [(f"/dev/{uio}", "mrw")]
    assert os.path.exists(f"/dev/{uio}")
    info = json.loads(resp.envs["PCIDEVICE_INTEL_COM_IGB_DPDK_INFO"])
    assert info[dpdk_vf]["uio"] == {"dev-mount": f"/dev/{uio}"}
