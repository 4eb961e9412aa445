"""PCI network devices (PFs and SR-IOV VFs) as sysfs shows them: the one reader of sysfs.

`discover` lists them for the device plugin, DRA and provisioning; `find_vf` looks one VF
up for the sriov CNI plugin. Everything is read below a configurable root (default
`/sys`) so tests can point it at a fake tree. Which interfaces carry a default route is
an input, not read here: the CLI gets it from `/proc/net/route` and
`/proc/net/ipv6_route` (`default_route_ifaces`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SYSFS = "/sys"
NETWORK_CLASS = 0x02  # PCI base class "network controller"
# ARPHRD_* numbers in net/<if>/type mapped to the names used by `linkTypes` selectors.
LINK_TYPES = {1: "ether", 32: "infiniband", 772: "loopback"}
# vDPA bus drivers and the `vdpaType` they stand for.
VDPA_DRIVERS = {"vhost_vdpa": "vhost", "virtio_vdpa": "virtio"}
# Drivers that hand a VF to userspace (DPDK): it then has no netdev.
VFIO_DRIVERS = frozenset({"vfio-pci"})
UIO_DRIVERS = frozenset({"igb_uio", "uio_pci_generic"})
USERSPACE_DRIVERS = VFIO_DRIVERS | UIO_DRIVERS
_VIRTFN = re.compile(r"^virtfn(\d+)$")


@dataclass(frozen=True)
class PciNetDevice:
    """One PCI network function as sysfs shows it."""

    address: str
    vendor: str  # 4 lower-case hex digits, no 0x
    device: str
    driver: str  # "" when unbound
    numa_node: int | None
    netdevs: tuple[str, ...]
    link_type: str  # "ether", "infiniband", the raw number if unknown, "" without netdev
    operstate: str  # of the first netdev, "" without netdev
    iommu_group: str | None
    rdma: tuple[str, ...]  # RDMA device names (`infiniband/*`)
    acpi_index: str | None
    vdpa_type: str | None  # "vhost" / "virtio" when a vDPA device sits on it
    pf_address: str | None = None  # set for a VF
    pf_netdev: str | None = None
    vf_index: int | None = None
    sriov_numvfs: int | None = None  # set for an SR-IOV capable PF
    sriov_totalvfs: int | None = None
    default_route: bool = False  # one of its netdevs carries a default route
    pcie_root: str = ""  # the host bridge it hangs off (`pci0000:00`), "" if unknown
    mac: str = ""  # of the first netdev, as the following three
    mtu: int | None = None
    admin_up: bool = False  # IFF_UP is set
    speed: int | None = None  # Mb/s; None when unknown (e.g. the link is down)

    @property
    def is_vf(self) -> bool:
        return self.pf_address is not None

    @property
    def netdev(self) -> str:
        """The first netdev name, "" if the device has none (e.g. bound to vfio-pci)."""
        return self.netdevs[0] if self.netdevs else ""

    @property
    def has_vfs(self) -> bool:
        """An SR-IOV PF with VFs enabled (the DP does not offer those)."""
        return bool(self.sriov_numvfs)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:  # "0x020000" (class, ids) or decimal ("-1", "7"), leading zeros allowed
        return int(text, 16) if text.lower().startswith("0x") else int(text, 10)
    except ValueError:
        return None


def _link_name(path: Path) -> str | None:
    """The basename of a symlink's target, None if it is not there."""
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _listdir(path: Path) -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError:
        return ()


def _hex_id(path: Path) -> str:
    text = (_read(path) or "").lower()
    return text.removeprefix("0x")


def is_network_class(dev_dir: Path) -> bool:
    value = _read_int(dev_dir / "class")
    return value is not None and value >> 16 == NETWORK_CLASS


def _vf_index(pf_dir: Path, vf_address: str) -> int | None:
    for name in _listdir(pf_dir):
        match = _VIRTFN.match(name)
        if match and _link_name(pf_dir / name) == vf_address:
            return int(match.group(1))
    return None


def _vdpa_type(dev_dir: Path) -> str | None:
    for name in _listdir(dev_dir):
        if name.startswith("vdpa"):
            driver = _link_name(dev_dir / name / "driver")
            if driver:
                return VDPA_DRIVERS.get(driver, driver)
    return None


def _netdev_state(dev_dir: Path) -> tuple[tuple[str, ...], str, str]:
    """The netdev names, with the first one's link type and operstate.

    udev may rename a fresh VF netdev (eth0 -> enp1s0v0) between the listing and the
    reads below; the listing is then taken again, a few times at most.
    """
    netdevs: tuple[str, ...] = ()
    for _ in range(3):
        netdevs = _listdir(dev_dir / "net")
        if not netdevs:
            return (), "", ""
        net = dev_dir / "net" / netdevs[0]
        number, state = _read_int(net / "type"), _read(net / "operstate")
        if number is not None and state is not None:
            return netdevs, LINK_TYPES.get(number, str(number)), state
    return netdevs, "", ""


IFF_UP = 0x1


def _netdev_settings(net: Path) -> tuple[str, int | None, bool, int | None]:
    """A netdev's MAC, MTU, admin state and speed (absent files: unknown)."""
    flags = _read_int(net / "flags") or 0
    speed = _read_int(net / "speed")
    return (
        _read(net / "address") or "",
        _read_int(net / "mtu"),
        bool(flags & IFF_UP),
        speed if speed is not None and speed > 0 else None,
    )


def _pcie_root(dev_dir: Path) -> str:
    """The first directory under `<root>/devices` on the device's real path."""
    devices = dev_dir.parents[3] / "devices"  # dev_dir is <root>/bus/pci/devices/<address>
    try:
        parts = dev_dir.resolve().relative_to(devices.resolve()).parts
    except (OSError, ValueError):
        return ""
    return parts[0] if len(parts) > 1 else ""


def read_device(dev_dir: Path, default_route_ifaces: Collection[str] = ()) -> PciNetDevice:
    """Read one PCI function's directory (`<root>/bus/pci/devices/<address>`)."""
    address = dev_dir.name
    netdevs, link_type, operstate = _netdev_state(dev_dir)
    mac, mtu, admin_up, speed = (
        _netdev_settings(dev_dir / "net" / netdevs[0]) if netdevs else ("", None, False, None)
    )
    numa = _read_int(dev_dir / "numa_node")
    pf_address = pf_netdev = None
    vf_index = None
    physfn = dev_dir / "physfn"
    if physfn.is_symlink():
        pf_address = _link_name(physfn)
        pf_nets = _listdir(physfn / "net")
        pf_netdev = pf_nets[0] if pf_nets else ""
        vf_index = _vf_index(physfn, address)
    return PciNetDevice(
        address=address,
        vendor=_hex_id(dev_dir / "vendor"),
        device=_hex_id(dev_dir / "device"),
        driver=_link_name(dev_dir / "driver") or "",
        numa_node=None if numa is None or numa < 0 else numa,
        netdevs=netdevs,
        link_type=link_type,
        operstate=operstate,
        iommu_group=_link_name(dev_dir / "iommu_group"),
        rdma=_listdir(dev_dir / "infiniband"),
        acpi_index=_read(dev_dir / "acpi_index"),
        vdpa_type=_vdpa_type(dev_dir),
        pf_address=pf_address,
        pf_netdev=pf_netdev,
        vf_index=vf_index,
        sriov_numvfs=_read_int(dev_dir / "sriov_numvfs"),
        sriov_totalvfs=_read_int(dev_dir / "sriov_totalvfs"),
        default_route=any(n in default_route_ifaces for n in netdevs),
        pcie_root=_pcie_root(dev_dir),
        mac=mac,
        mtu=mtu,
        admin_up=admin_up,
        speed=speed,
    )


def discover(
    root: str | os.PathLike[str] = DEFAULT_SYSFS, default_route_ifaces: Collection[str] = ()
) -> list[PciNetDevice]:
    """All PCI network functions (class 0x02xxxx) under `root`, sorted by address."""
    devices_dir = Path(root) / "bus" / "pci" / "devices"
    found = []
    for name in _listdir(devices_dir):
        dev_dir = devices_dir / name
        if is_network_class(dev_dir):
            found.append(read_device(dev_dir, default_route_ifaces))
    return found


@dataclass(frozen=True)
class Vf:
    """A VF as the sriov plugin needs it, seen from the calling namespace."""

    pci: str
    pf: str  # the PF's netdev
    index: int  # N in the PF's virtfnN
    netdev: str  # "" when the VF has none here (DPDK, or moved to another namespace)
    driver: str

    @property
    def dpdk(self) -> bool:
        return not self.netdev and self.driver in USERSPACE_DRIVERS


class NotAVf(LookupError):
    """A PCI address `find_vf` cannot hand out as a VF; the message says why."""


def device_dir(address: str, root: str | os.PathLike[str] = DEFAULT_SYSFS) -> Path:
    """A PCI function's directory, `<root>/bus/pci/devices/<address>`."""
    return Path(root) / "bus" / "pci" / "devices" / address


def driver_of(address: str, root: str | os.PathLike[str] = DEFAULT_SYSFS) -> str:
    """The driver PCI function `address` is bound to, "" if none."""
    return _link_name(device_dir(address, root) / "driver") or ""


def netdev_of(address: str, root: str | os.PathLike[str] = DEFAULT_SYSFS) -> str:
    """The netdev of PCI function `address` visible here, or ""."""
    names = _listdir(device_dir(address, root) / "net")
    return names[0] if names else ""


def find_vf(
    pci: str, root: str | os.PathLike[str] = DEFAULT_SYSFS, *, require_netdev: bool = True
) -> Vf:
    """The VF at PCI address `pci`; NotAVf if it is not a VF, its PF has no netdev, or
    (with `require_netdev`) it has neither a netdev here nor a DPDK driver."""
    dev = device_dir(pci, root)
    if not dev.exists():
        raise NotAVf(f"deviceID {pci}: no such PCI device in {dev.parent}")
    physfn = dev / "physfn"
    if not physfn.exists():
        raise NotAVf(f"deviceID {pci} is not an SR-IOV VF (it has no physfn)")
    pfs = _listdir(physfn / "net")
    if not pfs:
        raise NotAVf(f"deviceID {pci}: its PF {_link_name(physfn)} has no netdev")
    index = _vf_index(physfn, pci)
    if index is None:
        raise NotAVf(f"deviceID {pci}: not listed among the virtfnN links of PF {pfs[0]}")
    driver = driver_of(pci, root)
    vf = Vf(pci=pci, pf=pfs[0], index=index, netdev=netdev_of(pci, root), driver=driver)
    if require_netdev and not vf.netdev and not vf.dpdk:
        raise NotAVf(
            f"VF {pci} (driver {driver or 'none'}) has no netdev in this namespace "
            "and is not bound to a DPDK driver: is it in use by another pod?"
        )
    return vf


RTF_REJECT = 0x0200


def default_route_ifaces(
    route: str | os.PathLike[str] = "/proc/net/route",
    ipv6_route: str | os.PathLike[str] = "/proc/net/ipv6_route",
) -> set[str]:
    """Interfaces with an IPv4 or IPv6 default route (missing files count as none)."""
    names: set[str] = set()
    text4 = _read(Path(route)) or ""
    for line in text4.splitlines()[1:]:
        cols = line.split()
        # Iface Destination Gateway Flags RefCnt Use Metric Mask ...
        if len(cols) >= 8 and _hex(cols[1]) == 0 and _hex(cols[7]) == 0:
            names.add(cols[0])
    text6 = _read(Path(ipv6_route)) or ""
    for line in text6.splitlines():
        cols = line.split()
        # dest plen src splen nexthop metric refcnt use flags iface
        if len(cols) < 10 or _hex(cols[0]) != 0 or _hex(cols[1]) != 0:
            continue
        if (_hex(cols[8]) or 0) & RTF_REJECT or cols[9] == "lo":
            continue
        names.add(cols[9])
    return names


def _hex(text: str) -> int | None:
    try:
        return int(text, 16)
    except ValueError:
        return None
