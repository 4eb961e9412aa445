"""SR-IOV VFs for the sriov plugin: sysfs lookup, PF-side settings, lock and saved state.

`find_vf` reads sysfs (its root is a parameter, so unit tests can point it at a fake
tree); the netlink helpers take an open `Rtnl` in the namespace they act in.
VF settings are keyed by the names the plugin reports in errors: mac, vlan (vlan, qos,
proto), spoofchk, trust, link_state and rate (min, max in Mbps). The per-VF lock file and
the saved state (one JSON file per attachment) live in the plugin's data dir.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delegates.link import (
    IFINFO,
    RTM_GETLINK,
    RTM_NEWLINK,
    delete_altname,
    describe,
    errno_of,
    fail,
    find_link,
    ifinfo,
    set_link,
)
from delegates.rtnl import Rtnl, attr, attr_u32, iter_attrs, parse_attrs

log = logging.getLogger("plexus.delegates")

DPDK_DRIVERS = frozenset({"vfio-pci", "uio_pci_generic", "igb_uio"})
ETH_P_8021Q = 0x8100
ETH_P_8021AD = 0x88A8
SETTINGS = ("mac", "vlan", "spoofchk", "trust", "link_state", "rate")

# linux/if_link.h: the PF-side view and control of its VFs (attribute numbers and the
# ifla_vf_* payloads: u32 vf first, then the value)
IFLA_VFINFO_LIST, IFLA_EXT_MASK = 22, 29
RTEXT_FILTER_VF, RTEXT_FILTER_SKIP_STATS = 1, 8
IFLA_VF_INFO = IFLA_VF_VLAN_INFO = 1
IFLA_VF_MAC, IFLA_VF_VLAN, IFLA_VF_SPOOFCHK, IFLA_VF_LINK_STATE = 1, 2, 4, 5
IFLA_VF_RATE, IFLA_VF_TRUST, IFLA_VF_VLAN_LIST = 6, 9, 12
VF_MAC = struct.Struct("=I32s")  # ifla_vf_mac
VF_VLAN = struct.Struct("=III")  # ifla_vf_vlan: vf, vlan, qos (ifla_vf_vlan_info adds a be16)
VF_RATE = struct.Struct("=III")  # ifla_vf_rate: vf, min_tx_rate, max_tx_rate
VF_SETTING = struct.Struct("=II")  # ifla_vf_spoofchk / _trust / _link_state
VF_SETTING_ATTRS = {
    "spoofchk": IFLA_VF_SPOOFCHK,
    "trust": IFLA_VF_TRUST,
    "link_state": IFLA_VF_LINK_STATE,
}


@dataclass(frozen=True)
class Vf:
    """A VF as sysfs shows it from the calling namespace."""

    pci: str
    pf: str  # the PF's netdev
    index: int  # N in the PF's virtfnN
    netdev: str  # "" when the VF has none here (DPDK, or moved to another namespace)
    driver: str

    @property
    def dpdk(self) -> bool:
        return not self.netdev and self.driver in DPDK_DRIVERS


def _entries(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def netdev_of(pci: str, root: str | Path = "/sys") -> str:
    """The netdev of PCI device `pci` visible here, or ""."""
    names = _entries(Path(root) / "bus/pci/devices" / pci / "net")
    return names[0] if names else ""


def find_vf(pci: str, root: str | Path = "/sys", *, require_netdev: bool = True) -> Vf:
    """The VF at PCI address `pci`; CNIError if it is not a VF, its PF has no netdev, or
    (with `require_netdev`) it has neither a netdev here nor a DPDK driver."""
    dev = Path(root) / "bus/pci/devices" / pci
    if not dev.exists():
        raise fail(f"deviceID {pci}: no such PCI device in {dev.parent}")
    physfn = dev / "physfn"
    if not physfn.exists():
        raise fail(f"deviceID {pci} is not an SR-IOV VF (it has no physfn)")
    pfs = _entries(physfn / "net")
    if not pfs:
        raise fail(f"deviceID {pci}: its PF {os.path.basename(os.readlink(physfn))} has no netdev")
    index = -1
    for name in _entries(physfn):
        is_link = name.startswith("virtfn") and name[6:].isdigit()
        if is_link and os.path.basename(os.readlink(physfn / name)) == pci:
            index = int(name[6:])
            break
    if index < 0:
        raise fail(f"deviceID {pci}: not listed among the virtfnN links of PF {pfs[0]}")
    driver_link = dev / "driver"
    driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else ""
    vf = Vf(pci=pci, pf=pfs[0], index=index, netdev=netdev_of(pci, root), driver=driver)
    if require_netdev and not vf.netdev and not vf.dpdk:
        raise fail(
            f"VF {pci} (driver {driver or 'none'}) has no netdev in this namespace "
            "and is not bound to a DPDK driver: is it in use by another pod?"
        )
    return vf


def read_settings(nl: Rtnl, pf_index: int, vf: int) -> dict[str, Any]:
    """The PF's view of VF `vf` (IFLA_VFINFO_LIST), as JSON-able values."""
    mask = attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS)
    (msg,) = nl.request(RTM_GETLINK, ifinfo(pf_index) + mask)
    vflist = parse_attrs(msg, 16 + IFINFO.size).get(IFLA_VFINFO_LIST, b"")
    for kind, payload in iter_attrs(vflist):
        info = dict(iter_attrs(payload))
        if kind != IFLA_VF_INFO or IFLA_VF_MAC not in info:
            continue
        index, mac = VF_MAC.unpack_from(info[IFLA_VF_MAC])
        if index != vf:
            continue
        vlan, qos = VF_VLAN.unpack_from(info[IFLA_VF_VLAN])[1:] if IFLA_VF_VLAN in info else (0, 0)
        proto = ETH_P_8021Q
        for item_kind, item in iter_attrs(info.get(IFLA_VF_VLAN_LIST, b"")):
            if item_kind == IFLA_VF_VLAN_INFO and len(item) >= VF_VLAN.size + 2:
                proto = struct.unpack_from(">H", item, VF_VLAN.size)[0] or ETH_P_8021Q
        rate = VF_RATE.unpack_from(info[IFLA_VF_RATE])[1:] if IFLA_VF_RATE in info else (0, 0)
        return {
            "mac": ":".join(f"{b:02x}" for b in mac[:6]),
            "vlan": [vlan, qos, proto],
            "spoofchk": _setting(info, IFLA_VF_SPOOFCHK),
            "trust": _setting(info, IFLA_VF_TRUST),
            "link_state": _setting(info, IFLA_VF_LINK_STATE),
            "rate": list(rate),
        }
    raise fail(f"PF (index {pf_index}) reports no VF {vf}")


def _setting(info: dict[int, bytes], kind: int) -> int:
    """The value of an ifla_vf_<setting> {vf, setting} attribute, 0 if absent."""
    return int(VF_SETTING.unpack_from(info[kind])[1]) if kind in info else 0


def set_setting(nl: Rtnl, pf_index: int, vf: int, key: str, value: Any) -> None:
    """Set one VF setting through the PF; raises the kernel error unchanged."""
    if key == "vlan":
        vlan, qos, proto = value
        if proto != ETH_P_8021Q and vlan:
            info = VF_VLAN.pack(vf, vlan, qos) + struct.pack(">Hxx", proto)
            payload = attr(IFLA_VF_VLAN_LIST, attr(IFLA_VF_VLAN_INFO, info))
        else:
            payload = attr(IFLA_VF_VLAN, VF_VLAN.pack(vf, vlan, qos))
    elif key == "rate":
        payload = attr(IFLA_VF_RATE, VF_RATE.pack(vf, value[0], value[1]))
    elif key == "mac":
        payload = attr(IFLA_VF_MAC, VF_MAC.pack(vf, bytes.fromhex(value.replace(":", ""))))
    elif key in VF_SETTING_ATTRS:
        payload = attr(VF_SETTING_ATTRS[key], VF_SETTING.pack(vf, value))
    else:
        raise ValueError(f"unknown VF setting {key}")
    body = ifinfo(pf_index) + attr(IFLA_VFINFO_LIST, attr(IFLA_VF_INFO, payload))
    nl.request(RTM_NEWLINK, body)


def apply_settings(
    ipr: Rtnl, pf_index: int, vf: int, want: dict[str, Any], saved: dict[str, Any], labels: Any
) -> None:
    """Apply `want` in order; on a refusal, put back what was applied and fail naming it.

    `saved` holds the original values, `labels` maps a setting to the config field(s) it
    came from (the name the error shows).
    """
    done: list[str] = []
    for key, value in want.items():
        try:
            set_setting(ipr, pf_index, vf, key, value)
        except Exception as exc:
            restore_settings(ipr, pf_index, vf, {k: saved[k] for k in reversed(done)})
            raise fail(
                f"failed to set {labels.get(key, key)} of VF {vf}: {describe(exc)} "
                "(the PF refused it; nothing was changed)"
            ) from None
        done.append(key)


def restore_settings(ipr: Rtnl, pf_index: int, vf: int, saved: dict[str, Any]) -> list[str]:
    """Put back each saved setting; best effort, returns the errors."""
    errors = []
    for key, value in saved.items():
        try:
            set_setting(ipr, pf_index, vf, key, value)
        except Exception as exc:
            errors.append(f"{key}: {describe(exc)}")
    return errors


def set_netdev_mac(ipr: Rtnl, index: int, mac: str) -> None:
    """Give the VF netdev `mac`; call it with the link down (the fallback leaves it down).

    A PF refuses a VF's own MAC change once it set the VF's MAC administratively (igb:
    EADDRNOTAVAIL); the VF driver takes the administrative MAC when it resets, which an
    up/down cycle does.
    """
    link = find_link(ipr, index=index)
    if link is None or link.mac == mac:
        return
    try:
        set_link(ipr, index, mac=mac)
        return
    except Exception as exc:
        if errno_of(exc) != errno.EADDRNOTAVAIL:
            raise
        refused = exc
    set_link(ipr, index, up=True)
    set_link(ipr, index, up=False)
    link = find_link(ipr, index=index)
    if link is None or link.mac != mac:
        raise refused


def rename(ipr: Rtnl, index: int, name: str) -> None:
    """Down and rename; udev may have given the link its old name as an altname meanwhile."""
    set_link(ipr, index, up=False)
    try:
        set_link(ipr, index, name=name)
    except Exception as exc:
        holder = find_link(ipr, name) if errno_of(exc) == errno.EEXIST else None
        if holder is None or holder.index != index:
            raise
        delete_altname(ipr, index, name)
        set_link(ipr, index, name=name)


# -- the per-VF lock and the saved state -------------------------------------------------


class VfLock:
    """An exclusive flock on <dataDir>/<pci>.lock; the file names the attachment using it."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    def owner(self) -> str:
        os.lseek(self.fd, 0, os.SEEK_SET)
        return os.read(self.fd, 4096).decode().strip()

    def set_owner(self, key: str) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, key.encode(), 0)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@contextlib.contextmanager
def vf_lock(data_dir: str, pci: str) -> Iterator[VfLock]:
    """Hold the VF's lock; a waiter whose file was removed meanwhile takes a fresh one."""
    path = Path(data_dir) / f"{pci}.lock"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield VfLock(fd, path)
    finally:
        os.close(fd)


def cache_path(data_dir: str, key: str) -> Path:
    """The saved state of attachment `key` (containerID-ifname)."""
    return Path(data_dir) / f"{key}.json"


def write_cache(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def read_cache(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        log.warning("ignoring unreadable sriov state %s", path)
        return None
    return record if isinstance(record, dict) else None
