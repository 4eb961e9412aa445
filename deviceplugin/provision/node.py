"""One provisioning pass on this node: policies in, sysfs written, pools out. No API here.

A pass merges the policies, plans each PF, and applies at once every change that touches no
VF in use. A change that would destroy or rebind a VF a pod holds waits, and the pass says
which VFs and holders it waits for (`waiting`); the agent decides about evicting them. Once
a PF matched its config (its record says `applied`), a VF whose driver or MTU changes while
its group does not has drifted: it is restored when free, and only reported while in use
(evicting a pod for what it did to its own VF would be worse). What needs a reboot is tried
once per process and reported, never retried in a loop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from deviceplugin.config import ResourceConfig
from deviceplugin.provision.crs import NodePolicy, PfConfig
from deviceplugin.provision.holders import AllocationReader, Allocations, Holder
from deviceplugin.provision.host import Host, HostError
from deviceplugin.provision.merge import admit, merge, sriov_pfs
from deviceplugin.provision.plan import PfPlan, plan
from deviceplugin.provision.pools import DEFAULT_PREFIX, resources
from deviceplugin.provision.record import PfRecord, Records
from deviceplugin.sysfs import PciNetDevice, discover

ROUNDS = 3  # new or rebound VFs get another round: drivers, then their netdevs' MTUs

log = logging.getLogger("plexus.provision")

Desired = Callable[[list[PciNetDevice]], tuple[list[PfConfig], dict[str, str]]]


@dataclass
class PassResult:
    """What a pass found and did."""

    devices: list[PciNetDevice] = field(default_factory=list)  # as the pass left them
    desired: list[PfConfig] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # policy -> why
    resources: list[ResourceConfig] = field(default_factory=list)
    allocations: Allocations = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)  # what was written
    waiting: dict[str, set[Holder]] = field(default_factory=dict)  # VF -> whom it waits for
    drift: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reboot: list[str] = field(default_factory=list)  # problems only a reboot fixes


@dataclass(frozen=True)
class _Step:
    key: tuple[str, str]  # (device, what): a step that needs a reboot is not retried
    what: str
    write: Callable[..., None]
    args: tuple[object, ...]


class NodeProvisioner:
    """Applies PF configs on this host and keeps the records of what it did."""

    def __init__(
        self,
        host: Host,
        records: Records,
        allocations: AllocationReader,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.host = host
        self.records = records
        self.allocations = allocations
        self.prefix = prefix
        self._reboot: dict[tuple[str, str], str] = {}

    def discover(self) -> list[PciNetDevice]:
        return discover(self.host.root)

    def boot(self) -> PassResult:
        """Apply the recorded configs (no API needed): VFs exist before any pool does."""
        configs = [r.config for r in self.records.load().values()]
        return self._run(lambda devices: (configs, {}))

    def reconcile(self, policies: Sequence[NodePolicy], labels: dict[str, str]) -> PassResult:
        def desired(devices: list[PciNetDevice]) -> tuple[list[PfConfig], dict[str, str]]:
            pfs = sriov_pfs(devices)
            admission = admit(policies, labels, pfs)
            return merge(admission.admitted, pfs), admission.rejected

        return self._run(desired)

    def _run(self, desired_of: Desired) -> PassResult:
        result = PassResult()
        devices = self.discover()
        result.desired, result.rejected = desired_of(devices)
        rebound: set[str] = set()  # VFs this pass moved: their fresh netdevs are no drift
        for _ in range(ROUNDS):
            records = self.records.load()
            plans = plan(result.desired, devices, records)
            for pci in plans.forget:
                self.records.remove(pci)
            result.allocations = self.allocations.read(devices)
            result.waiting.clear()
            wrote = again = False
            for p in plans.pfs:
                now = self._now(p, records.get(p.pci), result, rebound)
                if not now.empty:
                    again |= self._apply(now, devices, records.get(p.pci), result)
                    rebound |= {vf for vf, _ in now.binds}
                    wrote = True
            if wrote:  # sysfs is read again only after writes
                devices = self.discover()
            if not again:
                break
        self._mark_applied(result.desired, devices)
        if self.allocations.problem:
            result.errors.append(self.allocations.problem)
        result.devices = devices
        result.reboot = sorted(set(self._reboot.values()))
        result.resources = resources(result.desired, devices, result.allocations, self.prefix)
        return result

    def _now(
        self, p: PfPlan, record: PfRecord | None, result: PassResult, rebound: set[str]
    ) -> PfPlan:
        """The part of `p` to apply now; what must wait, or drifted, is noted in `result`."""
        in_use = {vf: result.allocations[vf] for vf in p.touched if result.allocations.get(vf)}
        if p.num_vfs is not None and in_use:
            result.waiting.update(in_use)  # every VF of the PF goes: all of it waits
            return dataclasses.replace(p, pf_mtu=None, num_vfs=None, binds=(), vf_mtus=())
        drift = record is not None and record.applied and record.config == p.desired
        binds = []
        for vf, driver in p.binds:
            holders = in_use.get(vf)
            if holders and drift:
                who = ", ".join(sorted(map(str, holders)))
                result.drift.append(f"VF {vf} left its driver while held by {who}: not restored")
            elif holders:
                result.waiting[vf] = holders
            else:
                if drift:
                    result.drift.append(f"VF {vf} left its driver: bound to {driver} again")
                binds.append((vf, driver))
        if drift:
            result.drift += [
                f"VF {netdev} MTU changed: set to {mtu} again"
                for vf, netdev, mtu in p.vf_mtus
                if vf not in rebound
            ]
        return dataclasses.replace(p, binds=tuple(binds))

    def _apply(
        self, p: PfPlan, devices: list[PciNetDevice], record: PfRecord | None, result: PassResult
    ) -> bool:
        """Make `p`'s writes (its record first); True if VFs were made, removed or rebound
        (their drivers or netdevs are new: another round configures them)."""
        if p.desired is not None:
            pf = next(d for d in devices if d.address == p.pci)
            created = p.num_vfs is not None and not p.desired.externally_managed
            self.records.put(
                PfRecord(
                    pci_address=p.pci,
                    externally_managed=p.desired.externally_managed,
                    created_vfs=(record is not None and record.created_vfs) or created,
                    original_mtu=record.original_mtu if record else pf.mtu,
                    config=p.desired,
                    applied=record is not None and record.applied and record.config == p.desired,
                )
            )
        failed = False
        for step in self._steps(p):
            if step.key in self._reboot:
                continue
            try:
                step.write(*step.args)
            except HostError as exc:
                failed = True
                log.error("%s failed: %s", step.what, exc)
                if exc.reboot:
                    self._reboot[step.key] = f"{exc} (needs a reboot with {exc.reboot})"
                else:
                    result.errors.append(str(exc))
                if step.key[1] == "numvfs":
                    break  # the rest assumed the new VFs
                continue
            result.changed.append(step.what)
            log.info("%s", step.what)
        if p.desired is None and not failed:
            self.records.remove(p.pci)
        return (p.num_vfs is not None or bool(p.binds)) and not failed

    def _steps(self, p: PfPlan) -> list[_Step]:
        host = self.host
        steps = []
        if p.pf_mtu:
            steps.append(
                _Step(
                    (p.pci, "mtu"),
                    f"{p.netdev} MTU {p.pf_mtu}",
                    host.set_mtu,
                    (p.pci, p.netdev, p.pf_mtu),
                )
            )
        if p.num_vfs is not None:
            steps.append(
                _Step(
                    (p.pci, "numvfs"),
                    f"{p.netdev or p.pci}: {p.num_vfs} VFs",
                    host.set_num_vfs,
                    (p.pci, p.num_vfs),
                )
            )
        for vf, driver in p.binds:
            steps.append(_Step((vf, driver), f"VF {vf} bound to {driver}", host.bind, (vf, driver)))
        for vf, netdev, mtu in p.vf_mtus:
            steps.append(
                _Step((vf, "mtu"), f"VF {netdev} MTU {mtu}", host.set_mtu, (vf, netdev, mtu))
            )
        if p.link_up:
            steps.append(_Step((p.pci, "up"), f"{p.netdev} up", host.set_up, (p.pci, p.netdev)))
        return steps

    def _mark_applied(self, desired: list[PfConfig], devices: list[PciNetDevice]) -> None:
        """Record the PFs the host now matches (those Plexus did not touch too)."""
        records = self.records.load()
        left = {p.pci for p in plan(desired, devices, records).pfs}
        by_address = {d.address: d for d in devices}
        for config in desired:
            old = records.get(config.pci_address)
            if config.pci_address in left or config.pci_address not in by_address:
                continue
            if old is not None and old.applied and old.config == config:
                continue
            self.records.put(
                PfRecord(
                    pci_address=config.pci_address,
                    externally_managed=config.externally_managed,
                    created_vfs=old is not None and old.created_vfs,
                    original_mtu=old.original_mtu if old else by_address[config.pci_address].mtu,
                    config=config,
                    applied=True,
                )
            )
