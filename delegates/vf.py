"""SR-IOV VFs for the sriov plugin: PF-side settings, lock and saved state.

The VF itself is looked up in sysfs by `deviceplugin.sysfs.find_vf`; the netlink helpers
here take an open `Rtnl` in the namespace they act in.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cni import callscope, jsonio
from cni.errors import CNIError, ErrorCode
from cni.fileio import open_regular, read_regular, write_atomic
from delegates.link import (
    IFINFO,
    delete_altname,
    describe,
    errno_of,
    fail,
    find_link,
    link_body,
    set_link,
)

# Re-exported: the VLAN protocols callers name in VF settings.
from delegates.rtnl import ETH_P_8021AD as ETH_P_8021AD
from delegates.rtnl import ETH_P_8021Q as ETH_P_8021Q
from delegates.rtnl import (
    HEADER,
    RTM_GETLINK,
    RTM_NEWLINK,
    LinkMsg,
    Rtnl,
    attr_class,
    fields_of,
    iter_attrs,
    nested,
    numbers,
    parse_attrs,
)

log = logging.getLogger("plexus.delegates")

SETTINGS = ("mac", "vlan", "spoofchk", "trust", "link_state", "rate")

# IFLA_EXT_MASK bits (linux/rtnetlink.h), which pyroute2 0.9 names only in comments
RTEXT_FILTER_VF = 1 << 0
RTEXT_FILTER_SKIP_STATS = 1 << 3
# The PF-side view and control of its VFs, as pyroute2 defines them (linux/if_link.h).
_VFINFO = LinkMsg.vflist.vfinfo
_VLANS = _VFINFO.vf_vlist
VF = numbers(_VFINFO)
# setting -> (IFLA_VF_* attribute, the field of its ifla_vf_* struct after `vf`)
_ONE_FIELD = {
    "spoofchk": ("IFLA_VF_SPOOFCHK", "spoofchk"),
    "trust": ("IFLA_VF_TRUST", "trust"),
    "link_state": ("IFLA_VF_LINK_STATE", "link_state"),
}


def read_settings(nl: Rtnl, pf_index: int, vf: int) -> dict[str, Any]:
    """The PF's view of VF `vf` (IFLA_VFINFO_LIST), as JSON-able values."""
    mask = ("IFLA_EXT_MASK", RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS)
    (msg,) = nl.request(RTM_GETLINK, link_body(pf_index, [mask]))
    vflist = parse_attrs(msg, HEADER.size + IFINFO.size).get(numbers(LinkMsg)["IFLA_VFINFO_LIST"])
    for kind, payload in iter_attrs(vflist or b""):
        info = dict(iter_attrs(payload))
        mac = _struct(info, "IFLA_VF_MAC")
        if kind != numbers(LinkMsg.vflist)["IFLA_VF_INFO"] or mac.get("vf") != vf:
            continue
        vlan = _struct(info, "IFLA_VF_VLAN")
        proto = ETH_P_8021Q
        vlans = info.get(VF["IFLA_VF_VLAN_LIST"], b"")
        for item_kind, item in iter_attrs(vlans):
            if item_kind == numbers(_VLANS)["IFLA_VF_VLAN_INFO"]:
                proto = fields_of(_VLANS.ivvi, item).get("proto") or ETH_P_8021Q
        rate = _struct(info, "IFLA_VF_RATE")
        return {
            "mac": ":".join(f"{b:02x}" for b in mac["mac"][:6]),
            "vlan": [vlan.get("vlan", 0), vlan.get("qos", 0), proto],
            "spoofchk": _setting(info, "spoofchk"),
            "trust": _setting(info, "trust"),
            "link_state": _setting(info, "link_state"),
            "rate": [rate.get("min_tx_rate", 0), rate.get("max_tx_rate", 0)],
        }
    raise fail(f"PF (index {pf_index}) reports no VF {vf}")


def _struct(info: dict[int, bytes], name: str) -> dict[str, Any]:
    """The fields of the ifla_vf_* attribute `name` of an IFLA_VF_INFO, {} if absent."""
    payload = info.get(VF[name])
    return fields_of(attr_class(_VFINFO, name), payload) if payload is not None else {}


def _setting(info: dict[int, bytes], key: str) -> int:
    """The value of an ifla_vf_<setting> {vf, setting} attribute, 0 if absent."""
    name, field = _ONE_FIELD[key]
    return int(_struct(info, name).get(field, 0))


def set_setting(nl: Rtnl, pf_index: int, vf: int, key: str, value: Any) -> None:
    """Set one VF setting through the PF; raises the kernel error unchanged."""
    setting: tuple[str, Any]
    if key == "vlan":
        vlan, qos, proto = value
        if proto != ETH_P_8021Q and vlan:
            info = {"vf": vf, "vlan": vlan, "qos": qos, "proto": proto}
            setting = ("IFLA_VF_VLAN_LIST", nested(("IFLA_VF_VLAN_INFO", info)))
        else:
            setting = ("IFLA_VF_VLAN", {"vf": vf, "vlan": vlan, "qos": qos})
    elif key == "rate":
        setting = ("IFLA_VF_RATE", {"vf": vf, "min_tx_rate": value[0], "max_tx_rate": value[1]})
    elif key == "mac":
        setting = ("IFLA_VF_MAC", {"vf": vf, "mac": value})
    elif key in _ONE_FIELD:
        name, field = _ONE_FIELD[key]
        setting = (name, {"vf": vf, field: value})
    else:
        raise ValueError(f"unknown VF setting {key}")
    vfinfo = ("IFLA_VFINFO_LIST", nested(("IFLA_VF_INFO", nested(setting))))
    nl.request(RTM_NEWLINK, link_body(pf_index, [vfinfo]))


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

MAX_STATE = 65536
"""Bytes of saved state read at most (a VF's record is well under 1 KiB)."""


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
    """Hold the VF's lock; a waiter whose file was removed meanwhile takes a fresh one.
    `data_dir` is under the call's root (chrootDir); the file is a regular one, never
    opened through a symlink."""
    path = Path(callscope.current().on_host(data_dir)) / f"{pci}.lock"
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = open_regular(str(path), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            msg = f"cannot open the VF lock {path}"
            raise CNIError(ErrorCode.IO_FAILURE, msg, str(exc)) from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield VfLock(fd, path)
    finally:
        os.close(fd)


def cache_path(data_dir: str, key: str) -> Path:
    """The saved state of attachment `key` (containerID-ifname), under the call's root."""
    return Path(callscope.current().on_host(data_dir)) / f"{key}.json"


def write_cache(path: Path, record: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(record).encode())


def read_cache(path: Path) -> dict[str, Any] | None:
    """The saved state at `path`: a regular file of at most MAX_STATE bytes, not read
    through a symlink; None if there is none or it is unusable (logged)."""
    try:
        record = jsonio.loads(read_regular(str(path), MAX_STATE), f"sriov state {path}")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable sriov state %s: %s", path, exc)
        return None
    return record if isinstance(record, dict) else None
