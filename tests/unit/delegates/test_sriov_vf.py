"""VF lookup (deviceplugin.sysfs) in a fake sysfs tree (the host has no SR-IOV), VF settings,
the per-VF lock."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest

from cni.errors import CNIError
from delegates.link import IFINFO, RTM_NEWLINK
from delegates.rtnl import Rtnl, parse_attrs
from delegates.vf import ETH_P_8021AD, apply_settings, vf_lock
from deviceplugin.sysfs import NotAVf, find_vf, netdev_of

PF = "0000:01:00.0"
VF_NET = "0000:01:10.0"  # igbvf, has a netdev
VF_DPDK = "0000:01:10.2"  # vfio-pci, no netdev
VF_BUSY = "0000:01:10.4"  # igbvf, netdev elsewhere (moved to a pod)
PLAIN = "0000:02:00.0"  # not a VF


def _device(root: Path, pci: str, driver: str, netdev: str = "") -> Path:
    dev = root / "bus/pci/devices" / pci
    dev.mkdir(parents=True)
    drivers = root / "bus/pci/drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    (dev / "driver").symlink_to(os.path.relpath(drivers, dev))
    if netdev:
        (dev / "net" / netdev).mkdir(parents=True)
    return dev


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> Path:
    """A PF with three VFs (virtfn0..2) and a plain NIC, as /sys shows them."""
    root = tmp_path / "sys"
    pf = _device(root, PF, "igb", "enp1s0")
    for n, (pci, driver, netdev) in enumerate(
        [(VF_NET, "igbvf", "enp1s0v0"), (VF_DPDK, "vfio-pci", ""), (VF_BUSY, "igbvf", "")]
    ):
        vf = _device(root, pci, driver, netdev)
        (vf / "physfn").symlink_to(f"../{PF}")
        (pf / f"virtfn{n}").symlink_to(f"../{pci}")
    _device(root, PLAIN, "e1000e", "eno1")
    return root


def test_vf_with_a_netdev(fake_sysfs: Path) -> None:
    vf = find_vf(VF_NET, fake_sysfs)
    assert (vf.pci, vf.pf, vf.index, vf.netdev, vf.driver) == (
        VF_NET,
        "enp1s0",
        0,
        "enp1s0v0",
        "igbvf",
    )
    assert not vf.dpdk
    assert netdev_of(VF_NET, fake_sysfs) == "enp1s0v0"


def test_vf_bound_to_a_dpdk_driver(fake_sysfs: Path) -> None:
    vf = find_vf(VF_DPDK, fake_sysfs)
    assert (vf.index, vf.netdev, vf.driver, vf.dpdk) == (1, "", "vfio-pci", True)


def test_vf_without_netdev_or_dpdk_driver_is_in_use(fake_sysfs: Path) -> None:
    with pytest.raises(NotAVf) as info:
        find_vf(VF_BUSY, fake_sysfs)
    assert "no netdev" in str(info.value) and "igbvf" in str(info.value)
    vf = find_vf(VF_BUSY, fake_sysfs, require_netdev=False)
    assert (vf.index, vf.netdev, vf.dpdk) == (2, "", False)


@pytest.mark.parametrize(
    ("pci", "words"),
    [(PLAIN, "not an SR-IOV VF"), ("0000:09:00.0", "no such PCI device")],
)
def test_not_a_vf(fake_sysfs: Path, pci: str, words: str) -> None:
    with pytest.raises(NotAVf) as info:
        find_vf(pci, fake_sysfs)
    assert words in str(info.value) and pci in str(info.value)


def test_pf_without_netdev(fake_sysfs: Path) -> None:
    for entry in (fake_sysfs / "bus/pci/devices" / PF / "net").iterdir():
        entry.rmdir()
    with pytest.raises(NotAVf, match=f"its PF {PF} has no netdev"):
        find_vf(VF_NET, fake_sysfs)


# What the kernel's if_link.h says an IFLA_VF_INFO holds, decoded here independently of
# delegates.vf's encoder: attribute -> (setting, struct of its payload).
_VF_ATTRS = {1: ("mac", "=I6s26x"), 2: ("vlan", "=III"), 6: ("rate", "=III"), 12: ("vlans", "")}


class FakePf(Rtnl):
    """A FAKE PF (no socket): decodes each VF setting sent through it, refusing those in
    `refuse` with EINVAL."""

    def __init__(self, refuse: set[str]) -> None:  # no socket: no super()
        self.refuse = refuse
        self.calls: list[dict[str, Any]] = []

    def request(self, msg_type: int, body: bytes, flags: int = 0) -> list[bytes]:
        assert msg_type == RTM_NEWLINK and IFINFO.unpack_from(body)[2] == 7
        (vfinfo,) = parse_attrs(body, IFINFO.size).values()
        ((kind, payload),) = parse_attrs(parse_attrs(vfinfo)[1]).items()
        name, layout = _VF_ATTRS[kind]
        if name == "vlans":
            item = parse_attrs(payload)[1]
            vf, vlan, qos = struct.unpack_from("=III", item)
            call = {
                "vf": vf,
                "vlan": [{"vlan": vlan, "qos": qos, "proto": int.from_bytes(item[12:14])}],
            }
        elif name == "mac":
            vf, mac = struct.unpack(layout, payload)
            call = {"vf": vf, "mac": ":".join(f"{b:02x}" for b in mac)}
        else:
            vf, *values = struct.unpack(layout, payload)
            call = {"vf": vf, name: values}
        if name in self.refuse:
            raise OSError(22, "Invalid argument")
        self.calls.append(call)
        return []


def test_a_refused_setting_puts_back_what_was_applied() -> None:
    saved = {"mac": "00:00:00:00:00:00", "vlan": [0, 0, 0x8100], "rate": [0, 0]}
    want = {"mac": "02:00:00:00:00:01", "vlan": [100, 3, ETH_P_8021AD], "rate": [10, 0]}
    ipr = FakePf(refuse={"rate"})
    with pytest.raises(CNIError) as info:
        apply_settings(ipr, 7, 2, want, saved, {"rate": "min_tx_rate"})
    assert "min_tx_rate" in info.value.msg and "invalid argument" in info.value.msg
    assert ipr.calls == [
        {"vf": 2, "mac": "02:00:00:00:00:01"},
        {"vf": 2, "vlan": [{"vlan": 100, "qos": 3, "proto": ETH_P_8021AD}]},
        {"vf": 2, "vlan": [0, 0]},
        {"vf": 2, "mac": "00:00:00:00:00:00"},
    ]


def test_vf_lock_names_its_owner_and_can_be_removed(tmp_path: Path) -> None:
    data = str(tmp_path / "state")
    with vf_lock(data, VF_NET) as lock:
        assert lock.owner() == ""
        lock.set_owner("cid-net1")
    with vf_lock(data, VF_NET) as lock:
        assert lock.owner() == "cid-net1"
        lock.remove()
    assert not (tmp_path / "state" / f"{VF_NET}.lock").exists()
    with vf_lock(data, VF_NET) as lock:
        assert lock.owner() == ""
