"""The SR-IOV CNI plugin (`type: sriov`): a VF, configured through its PF, moved into a pod.

Config (as sriov-cni): `deviceID` (the VF's PCI address; Multus also injects `pciBusID`,
and `runtimeConfig.deviceID`/`pciBusID` are read too), `vlan` 0-4094, `vlanQoS` 0-7,
`vlanProto` 802.1q/802.1ad, `mac`, `spoofchk`/`trust` on|off, `link_state`
auto|enable|disable, `min_tx_rate`/`max_tx_rate` (Mbps), optional `ipam`, and our
`dataDir` (default /var/lib/cni/plexus-sriov) for the per-VF locks and the saved state.

ADD locks the VF, saves its PF-side settings and its netdev's name and MAC under the
attachment (containerID + ifname), applies only the requested settings (a refusal puts
back what was applied), moves the netdev into the pod under a temporary name, renames
it, sets the MAC, brings it up and applies IPAM. A VF bound to a DPDK driver stays where
it is; the result carries its PCI address. DEL undoes exactly that; with no saved state,
or with the pod namespace gone, it still succeeds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cni import skel
from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.fileio import name_problem
from cni.hwaddr import station_problem
from cni.result import DNS, Interface, Result
from delegates import ipconfig
from delegates.link import describe, fail, find_link, netlink, netns_fd, set_link, temp_name
from delegates.macvlan import parse_mac
from delegates.netns import NetnsGone, run_in_netns
from delegates.rtnl import ETH_P_8021AD, ETH_P_8021Q, IFF_UP
from delegates.sublink import decode_conf, parse_prev_result
from delegates.vf import (
    VfLock,
    apply_settings,
    cache_path,
    read_cache,
    read_settings,
    rename,
    restore_settings,
    set_netdev_mac,
    vf_lock,
    write_cache,
)
from deviceplugin.sysfs import NotAVf, Vf, device_dir, find_vf, netdev_of

if TYPE_CHECKING:  # the standalone plugins start without importing it
    from cni.invoke import Executor

log = logging.getLogger("plexus.delegates")

DATA_DIR = "/var/lib/cni/plexus-sriov"
HOME_WAIT = 10.0  # how long DEL waits for a VF the kernel is returning from a dead netns
_PCI = re.compile(r"(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_ON_OFF = {"on": 1, "off": 0}
_LINK_STATES = {"auto": 0, "enable": 1, "disable": 2}
_PROTOS = {"802.1q": ETH_P_8021Q, "802.1ad": ETH_P_8021AD}


def _invalid(msg: str) -> CNIError:
    return CNIError(ErrorCode.INVALID_CONFIG, f"invalid sriov config: {msg}")


def _int(raw: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _invalid(f"{key} must be an integer in [{lo}, {hi}], got {json.dumps(value)}")
    return int(value)


def _choice(raw: dict[str, Any], key: str, choices: dict[str, int]) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in choices:
        raise _invalid(f"{key} must be one of {'/'.join(choices)}, got {json.dumps(value)}")
    return choices[value.lower()]


@dataclass
class SriovConf:
    """The validated plugin config."""

    raw: dict[str, Any]
    device_id: str
    vlan: int | None = None
    qos: int | None = None
    proto: int | None = None
    mac: str = ""
    spoofchk: int | None = None
    trust: int | None = None
    link_state: int | None = None
    min_tx_rate: int | None = None
    max_tx_rate: int | None = None
    ipam_type: str = ""
    data_dir: str = DATA_DIR
    dns: DNS = field(default_factory=DNS)

    def wanted(self, saved: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """The VF settings to apply (given the saved ones) and the config field of each."""
        want: dict[str, Any] = {}
        labels: dict[str, str] = {}
        if self.mac:
            want["mac"], labels["mac"] = self.mac, "mac"
        if self.vlan is not None:
            want["vlan"] = [self.vlan, self.qos or 0, self.proto or ETH_P_8021Q]
            labels["vlan"] = "vlan/vlanQoS/vlanProto"
        for key in ("spoofchk", "trust", "link_state"):
            if getattr(self, key) is not None:
                want[key], labels[key] = getattr(self, key), key
        if self.min_tx_rate is not None or self.max_tx_rate is not None:
            low, high = saved["rate"]
            want["rate"] = [
                low if self.min_tx_rate is None else self.min_tx_rate,
                high if self.max_tx_rate is None else self.max_tx_rate,
            ]
            asked = [k for k in ("min_tx_rate", "max_tx_rate") if getattr(self, k) is not None]
            labels["rate"] = "/".join(asked)
        return want, labels


def load_conf(stdin: bytes) -> SriovConf:
    """Parse and validate the config; CNIError(INVALID_CONFIG) naming the bad field."""
    raw = decode_conf(stdin)
    found = raw.get("runtimeConfig")
    runtime: dict[str, Any] = found if isinstance(found, dict) else {}
    candidates = [raw.get("deviceID"), raw.get("pciBusID")]
    candidates += [runtime.get("deviceID"), runtime.get("pciBusID")]
    device = next((c for c in candidates if c), None)
    if device is None:
        raise _invalid("deviceID is required (the VF's PCI address)")
    if not isinstance(device, str) or not _PCI.fullmatch(device):
        raise _invalid(f"deviceID must be a PCI address like 0000:01:10.0, got {device!r}")
    conf = SriovConf(raw=raw, device_id=device if device.count(":") == 2 else f"0000:{device}")
    conf.device_id = conf.device_id.lower()
    conf.vlan = _int(raw, "vlan", 0, 4094)
    conf.qos = _int(raw, "vlanQoS", 0, 7)
    conf.proto = _choice(raw, "vlanProto", _PROTOS)
    if conf.vlan is None and (conf.qos is not None or conf.proto is not None):
        raise _invalid("vlanQoS and vlanProto need a vlan")
    mac = runtime.get("mac") or raw.get("mac")
    if mac is not None:
        if not isinstance(mac, str):
            raise _invalid(f"mac must be a string, got {json.dumps(mac)}")
        try:
            conf.mac = parse_mac(mac)
        except CNIError:
            raise _invalid(f"mac {mac!r} is not a MAC address") from None
    conf.spoofchk = _choice(raw, "spoofchk", _ON_OFF)
    conf.trust = _choice(raw, "trust", _ON_OFF)
    conf.link_state = _choice(raw, "link_state", _LINK_STATES)
    conf.min_tx_rate = _int(raw, "min_tx_rate", 0, 2**32 - 1)
    conf.max_tx_rate = _int(raw, "max_tx_rate", 0, 2**32 - 1)
    if conf.min_tx_rate and conf.max_tx_rate and conf.min_tx_rate > conf.max_tx_rate:
        raise _invalid("min_tx_rate must not exceed max_tx_rate")
    ipam = raw.get("ipam")
    if ipam is not None:
        if not isinstance(ipam, dict) or not isinstance(ipam.get("type", ""), str):
            raise _invalid("ipam must be an object with a string type")
        conf.ipam_type = ipam.get("type", "")
    data_dir = raw.get("dataDir", DATA_DIR)
    if not isinstance(data_dir, str) or not data_dir:
        raise _invalid("dataDir must be a non-empty path")
    conf.data_dir = data_dir
    try:
        conf.dns = DNS.model_validate(raw.get("dns") or {})
    except ValueError as exc:
        raise _invalid(f"dns: {exc}") from None
    return conf


# -- the plugin ----------------------------------------------------------------------------


class SriovPlugin:
    """`type: sriov`; implements cni.skel.Plugin. `sysfs` is the root to find VFs under;
    `ipam_exec`: IPAM types to exec from CNI_PATH instead of in-process (`execDelegates`),
    with `ipam_executor` (default: a plain exec)."""

    def __init__(
        self,
        sysfs: str = "/sys",
        ipam_exec: Iterable[str] = (),
        ipam_executor: Executor | None = None,
    ) -> None:
        self.sysfs = sysfs
        self.ipam_exec = frozenset(ipam_exec)
        self.ipam_executor = ipam_executor

    def add(self, args: CmdArgs) -> Result:
        conf = load_conf(args.stdin)
        key = f"{args.container_id}-{args.ifname}"
        if conf.mac and (problem := station_problem(conf.mac)):
            raise _invalid(f"mac {problem}")
        if problem := name_problem(f"{key}.json"):
            raise CNIError(
                ErrorCode.INVALID_ENV,
                f"CNI_CONTAINERID {args.container_id!r} is too long to name the saved state "
                f"of its attachment ({key}.json: {problem})",
            )
        with vf_lock(conf.data_dir, conf.device_id) as lock:
            owner = lock.owner()
            if owner and owner != key and cache_path(conf.data_dir, owner).exists():
                raise fail(f"VF {conf.device_id} is already in use by attachment {owner}")
            if cache_path(conf.data_dir, key).exists():
                raise fail(f"attachment {key} already holds a VF: DEL it first")
            vf = self._find_vf(conf.device_id)
            return self._add(conf, args, vf, lock, key)

    def _find_vf(self, pci: str, require_netdev: bool = True) -> Vf:
        """sysfs.find_vf under this plugin's root; why it is no usable VF as the plugin's error."""
        try:
            return find_vf(pci, self.sysfs, require_netdev=require_netdev)
        except NotAVf as exc:
            raise fail(str(exc)) from None

    def _add(self, conf: SriovConf, args: CmdArgs, vf: Vf, lock: VfLock, key: str) -> Result:
        path = cache_path(conf.data_dir, key)
        with netlink() as ipr:
            pf = find_link(ipr, vf.pf)
            if pf is None:
                raise fail(f"PF {vf.pf} of VF {vf.pci} not found")
            saved = read_settings(ipr, pf.index, vf.index)
            host = find_link(ipr, vf.netdev) if vf.netdev else None
            want, labels = conf.wanted(saved)
            record = {
                "pci": vf.pci,
                "pf": vf.pf,
                "vf": vf.index,
                "dpdk": vf.dpdk,
                "netdev": vf.netdev,
                "netdev_mac": host.mac if host else "",
                "netdev_up": bool(host.flags & IFF_UP) if host else False,
                "netns": args.netns,
                "ifname": args.ifname,
                "tmp": temp_name(),
                "original": saved,
                "changed": {"mac": saved["mac"], **{k: saved[k] for k in want}},
            }
            write_cache(path, record)  # before any change: a crash still leaves DEL the state
            lock.set_owner(key)
            try:
                apply_settings(ipr, pf.index, vf.index, want, saved, labels)
            except BaseException:
                path.unlink()
                raise
        ipc: Result | None = None
        try:
            if conf.ipam_type:
                ipc = self._ipam(conf, args)
            if vf.dpdk:
                iface = Interface(name=args.ifname, sandbox=args.netns, pci_id=vf.pci)
            else:
                iface = self._into_pod(vf, record, conf, args, ipc)
        except BaseException:
            _quietly(lambda: self._undo(record, args))
            if conf.ipam_type:
                _quietly(lambda: self._ipam_del(conf, args))
            path.unlink()
            raise
        return ipconfig.attached_result(iface, conf.dns, ipc)

    def _ipam(self, conf: SriovConf, args: CmdArgs) -> Result:
        from delegates.ipam.dispatch import ipam_add

        result = ipam_add(conf.raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)
        if not result.ips:
            _quietly(lambda: self._ipam_del(conf, args))
            raise fail("IPAM plugin returned missing IP config")
        return result

    def _into_pod(
        self, vf: Vf, record: dict[str, Any], conf: SriovConf, args: CmdArgs, ipc: Result | None
    ) -> Interface:
        tmp = record["tmp"]
        with netlink() as ipr:
            link = find_link(ipr, vf.netdev)
            if link is None:
                raise fail(f"VF netdev {vf.netdev} disappeared")
            try:
                set_link(ipr, link.index, up=False)
                set_link(ipr, link.index, name=tmp)
                with netns_fd(args.netns) as fd:
                    set_link(ipr, link.index, netns_fd=fd)
            except CNIError:
                raise
            except Exception as exc:
                msg = f"failed to move VF netdev {vf.netdev} into the pod: {describe(exc)}"
                raise fail(msg) from None
        iface = run_in_netns(args.netns, lambda: _configure(tmp, conf, args, ipc))
        return iface.model_copy(update={"pci_id": vf.pci})

    def _undo(self, record: dict[str, Any], args: CmdArgs) -> None:
        """Put the VF back as it was: netdev home under its name, PF settings, netdev MAC."""
        errors = []
        if not device_dir(record["pci"], self.sysfs).exists():
            log.warning("VF %s is gone (SR-IOV disabled?): nothing to restore", record["pci"])
            return
        if not record["dpdk"]:
            self._bring_home(record, args.netns or record["netns"])
        with netlink() as ipr:
            pf = find_link(ipr, record["pf"])
            if pf is None:
                raise fail(f"PF {record['pf']} not found: cannot restore VF {record['vf']}")
            errors += restore_settings(ipr, pf.index, record["vf"], record["changed"])
            name = netdev_of(record["pci"], self.sysfs)
            link = find_link(ipr, name) if name else None
            if link is not None and record["netdev_mac"]:
                try:
                    set_netdev_mac(ipr, link.index, record["netdev_mac"])
                except Exception as exc:
                    errors.append(f"netdev mac: {describe(exc)}")
            if link is not None and record["netdev_up"]:
                with contextlib.suppress(OSError):
                    set_link(ipr, link.index, up=True)
        if errors:
            raise fail(f"failed to restore VF {record['pci']}: {'; '.join(errors)}")

    def _bring_home(self, record: dict[str, Any], netns: str) -> None:
        """Move the netdev from the pod back here and give it its original name."""
        if netns:
            with netns_fd("/proc/thread-self/ns/net") as home:
                names = (record["ifname"], record["tmp"])
                with contextlib.suppress(NetnsGone):
                    run_in_netns(netns, lambda: _send_home(names, home))
        deadline = time.monotonic() + HOME_WAIT
        name = netdev_of(record["pci"], self.sysfs)
        while not name and time.monotonic() < deadline:
            time.sleep(0.1)  # a dying netns hands its physical devices back asynchronously
            name = netdev_of(record["pci"], self.sysfs)
        if not name:
            log.warning("VF %s has no netdev in the host namespace", record["pci"])
            return
        if name != record["netdev"]:
            with netlink() as ipr:
                link = find_link(ipr, name)
                try:
                    if link is not None:
                        rename(ipr, link.index, record["netdev"])
                except Exception as exc:
                    msg = f"failed to rename {name} back to {record['netdev']}: {describe(exc)}"
                    raise fail(msg) from None

    def delete(self, args: CmdArgs) -> None:
        conf = load_conf(args.stdin)
        key = f"{args.container_id}-{args.ifname}"
        path = cache_path(conf.data_dir, key)
        record = read_cache(path)
        if record is not None:
            with vf_lock(conf.data_dir, record["pci"]) as lock:
                self._undo(record, args)
                path.unlink(missing_ok=True)
                if lock.owner() in ("", key):
                    lock.remove()
        if conf.ipam_type:
            self._ipam_del(conf, args)

    def check(self, args: CmdArgs) -> None:
        conf = load_conf(args.stdin)
        prev = parse_prev_result(conf.raw)
        if prev is None:
            raise fail("Required prevResult missing")
        if conf.ipam_type:
            from delegates.ipam.dispatch import ipam_check

            ipam_check(conf.raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)
        mine = [i for i in prev.interfaces if i.name == args.ifname and i.sandbox == args.netns]
        if not mine:
            raise fail(f"prevResult has no interface {args.ifname} in {args.netns}")
        vf = self._find_vf(conf.device_id, require_netdev=False)
        with netlink() as ipr:
            pf = find_link(ipr, vf.pf)
            if pf is None:
                raise fail(f"PF {vf.pf} of VF {vf.pci} not found")
            have = read_settings(ipr, pf.index, vf.index)
        want, labels = conf.wanted(have)
        for setting, value in want.items():
            if have[setting] != value:
                raise fail(f"VF {vf.pci} {labels[setting]} is {have[setting]}, expected {value}")
        if vf.dpdk:
            return
        run_in_netns(args.netns, lambda: _verify(mine[0], prev, args.ifname))

    def status(self, args: CmdArgs) -> None:
        """Ready whenever the plugin can run."""

    def _ipam_del(self, conf: SriovConf, args: CmdArgs) -> None:
        from delegates.ipam.dispatch import ipam_del

        ipam_del(conf.raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)

    def gc(self, args: CmdArgs) -> None:
        """Pass GC to IPAM; VFs are returned by DEL."""
        conf = load_conf(args.stdin)
        if conf.ipam_type:
            from delegates.ipam.dispatch import ipam_gc

            ipam_gc(conf.raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)


def _configure(tmp: str, conf: SriovConf, args: CmdArgs, ipc: Result | None) -> Interface:
    """Inside the pod: rename, MAC, up, addresses and routes."""
    with netlink() as ipr:
        link = find_link(ipr, tmp)
        if link is None:
            raise fail(f"VF netdev {tmp} not found in the pod")
        step = f'rename it to "{args.ifname}"'
        try:
            set_link(ipr, link.index, name=args.ifname)
            if conf.mac:
                step = f"set mac {conf.mac}"
                set_netdev_mac(ipr, link.index, conf.mac)
            step = "bring it up"
            set_link(ipr, link.index, up=True)
        except Exception as exc:
            raise fail(f"failed to {step} (VF netdev {tmp}): {describe(exc)}") from None
        link = find_link(ipr, index=link.index) or link
        return ipconfig.configure_pod_iface(ipr, link, args.netns, ipc)


def _send_home(names: tuple[str, ...], home: int) -> None:
    """Inside the pod: move the VF netdev (by its pod or temporary name) to `home`."""
    with netlink() as ipr:
        link = next((lk for lk in (find_link(ipr, n) for n in names) if lk is not None), None)
        if link is None:
            return
        try:
            set_link(ipr, link.index, up=False)
            set_link(ipr, link.index, name=temp_name())
            set_link(ipr, link.index, netns_fd=home)
        except Exception as exc:
            raise fail(f"failed to move {link.name} back to the host: {describe(exc)}") from None


def _verify(want: Interface, prev: Result, ifname: str) -> None:
    with netlink() as ipr:
        link = find_link(ipr, want.name)
        if link is None:
            raise fail(f"VF netdev {want.name} not found in the pod")
        if want.mac and want.mac.lower() != link.mac:
            raise fail(
                f"Interface {want.name} Mac {want.mac} doesn't match container Mac: {link.mac}"
            )
        ipconfig.verify_ips(ipr, link, prev.ips)
        ipconfig.verify_routes(ipr, prev, ifname)


def _quietly(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception as exc:
        log.warning("cleanup after a failed ADD failed: %s", exc)


def main() -> None:
    """The `plexus-sriov` binary."""
    sys.exit(skel.run(SriovPlugin()))
