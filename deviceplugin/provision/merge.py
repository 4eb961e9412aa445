"""A node's policies merged into each PF's desired config, the way the operator merges them.

`admit` first makes the operator webhook's checks that need the node's hardware or the other
policies (no webhook runs with Plexus): a policy that fails one is left out and reported,
the later-created one of two that conflict. `merge` then follows the operator's
`SriovNetworkNodePolicy.Apply`: policies in order of priority (99 first, 0 last, so 0 wins;
ties by name); a later policy replaces a PF's config unless their VF groups can live side by
side (different resources, ranges that do not overlap), or the two have equal priority: then
the PF keeps both groups and takes the larger MTU and numVfs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from deviceplugin.provision.crs import NodePolicy, PfConfig, VfGroup
from deviceplugin.sysfs import PciNetDevice

DEPRECATED_DEFAULT = "default"  # the operator ignores a policy of this name


@dataclass(frozen=True)
class Partition:
    """One `pfNames` entry: a PF name and its VF range (None: the whole PF)."""

    pf: str
    first: int | None = None
    last: int | None = None

    @classmethod
    def parse(cls, entry: str) -> Partition:
        """`ens1f0#2-5` -> Partition("ens1f0", 2, 5); ValueError if the range is malformed."""
        name, sep, rng = entry.partition("#")
        if not sep:
            return cls(entry)
        first, dash, last = rng.partition("-")
        if not (dash and first.isdigit() and last.isdigit()) or "#" in rng:
            raise ValueError(f"pfNames entry {entry!r}: want '<pf>#<first>-<last>'")
        return cls(name, int(first), int(last))


@dataclass
class Admission:
    """The policies that apply to this node, and why the others were left out."""

    admitted: list[NodePolicy] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # policy name -> why


def node_selected(policy: NodePolicy, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in policy.spec.node_selector.items())


def sriov_pfs(devices: Iterable[PciNetDevice]) -> list[PciNetDevice]:
    """The SR-IOV capable PFs among discovered devices, by PCI address."""
    return [d for d in devices if not d.is_vf and (d.sriov_totalvfs or 0) > 0]


def nic_selected(policy: NodePolicy, pf: PciNetDevice) -> bool:
    """The operator's `SriovNetworkNicSelector.Selected` (every field given must match)."""
    sel = policy.spec.nic_selector
    if sel.vendor and sel.vendor.lower() != pf.vendor:
        return False
    if sel.device_id and sel.device_id.lower() != pf.device:
        return False
    if sel.root_devices and pf.address not in sel.root_devices:
        return False
    if sel.pf_names and pf.netdev not in {Partition.parse(p).pf for p in sel.pf_names}:
        return False
    return not sel.net_filter  # refused by the CRD: matches nothing here


def _group(policy: NodePolicy, pf: PciNetDevice) -> VfGroup:
    """The policy's VF group on `pf`: its `pfNames` range for that PF, else all its VFs."""
    spec = policy.spec
    first, last = 0, spec.num_vfs - 1
    for entry in spec.nic_selector.pf_names:
        part = Partition.parse(entry)
        if part.pf == pf.netdev:
            if part.first is not None and part.last is not None:
                first, last = part.first, part.last
            break
    return VfGroup(
        resource_name=spec.resource_name,
        device_type=spec.device_type,
        first=first,
        last=last,
        policy_name=policy.name,
        mtu=spec.mtu,
        is_rdma=spec.is_rdma,
        need_vhost_net=spec.need_vhost_net,
        exclude_topology=spec.exclude_topology,
        link_type=spec.link_type,
    )


def admit(
    policies: Sequence[NodePolicy], labels: dict[str, str], pfs: Sequence[PciNetDevice]
) -> Admission:
    """The node's policies that pass the operator webhook's node and cross-policy checks."""
    out = Admission()
    candidates = [p for p in policies if p.name != DEPRECATED_DEFAULT and node_selected(p, labels)]
    for policy in sorted(candidates, key=lambda p: (p.created, p.name)):
        why = _hardware_problem(policy, pfs) or _conflict(policy, out.admitted, pfs)
        if why:
            out.rejected[policy.name] = why
        else:
            out.admitted.append(policy)
    return out


def _hardware_problem(policy: NodePolicy, pfs: Sequence[PciNetDevice]) -> str:
    spec = policy.spec
    for pf in pfs:
        if not nic_selected(policy, pf):
            continue
        total = pf.sriov_totalvfs or 0
        if spec.num_vfs > total:
            return (
                f"numVfs({spec.num_vfs}) exceeds the maximum allowed value({total}) "
                f"of interface {pf.netdev or pf.address}"
            )
        if spec.externally_managed:
            have = pf.sriov_numvfs or 0
            if spec.num_vfs > have:
                return (
                    f"numVfs({spec.num_vfs}) is higher than the VFs created externally "
                    f"on {pf.netdev or pf.address} ({have})"
                )
            if spec.mtu and pf.mtu is not None and spec.mtu > pf.mtu:
                return (
                    f"MTU({spec.mtu}) is higher than the MTU of the externally managed PF "
                    f"{pf.netdev or pf.address} ({pf.mtu})"
                )
        if spec.link_type and not _same_link_type(spec.link_type, pf.link_type):
            return f"linkType {spec.link_type} but {pf.netdev or pf.address} is {pf.link_type}"
    return ""


def _same_link_type(wanted: str, sysfs_type: str) -> bool:
    return {"eth": "ether", "ib": "infiniband"}.get(wanted.lower()) == sysfs_type


def _conflict(
    policy: NodePolicy, admitted: Sequence[NodePolicy], pfs: Sequence[PciNetDevice]
) -> str:
    spec = policy.spec
    names = {pf.netdev for pf in pfs}
    for other in admitted:
        if spec.resource_name == other.spec.resource_name and (
            spec.exclude_topology != other.spec.exclude_topology
        ):
            return (
                f"excludeTopology[{str(spec.exclude_topology).lower()}] conflicts with policy "
                f"{other.name} for the same resource {spec.resource_name}"
            )
        for root in set(spec.nic_selector.root_devices) & set(other.spec.nic_selector.root_devices):
            return f"root device {root} is overlapped with existing policy {other.name}"
        for mine in map(Partition.parse, spec.nic_selector.pf_names):
            for theirs in map(Partition.parse, other.spec.nic_selector.pf_names):
                if mine.pf != theirs.pf or mine.pf not in names:
                    continue
                if spec.externally_managed != other.spec.externally_managed:
                    return f"externallyManaged is inconsistent with existing policy {other.name}"
                if _ranges_overlap(mine, theirs):
                    return (
                        f"VF index range in {mine.pf}#{mine.first}-{mine.last} is overlapped "
                        f"with existing policy {other.name}"
                    )
    return ""


def _ranges_overlap(a: Partition, b: Partition) -> bool:
    """Only explicit ranges conflict (a whole-PF entry is settled by priority in `merge`)."""
    if None in (a.first, a.last, b.first, b.last):
        return False
    assert a.first is not None and a.last is not None and b.first is not None and b.last is not None
    return a.first <= b.last and b.first <= a.last


def merge(policies: Sequence[NodePolicy], pfs: Sequence[PciNetDevice]) -> list[PfConfig]:
    """Each selected PF's config (admitted policies only), in the order PFs were first set."""
    state: dict[str, PfConfig] = {}
    previous = 100  # no policy has it: the first never counts as equal priority
    for policy in sorted(policies, key=lambda p: (-p.spec.priority, p.name)):
        _apply(policy, state, pfs, policy.spec.priority == previous)
        previous = policy.spec.priority
    return list(state.values())


def _apply(
    policy: NodePolicy, state: dict[str, PfConfig], pfs: Sequence[PciNetDevice], equal: bool
) -> None:
    spec = policy.spec
    if spec.nic_selector.empty() or spec.num_vfs <= 0:
        return
    for pf in pfs:
        if not nic_selected(policy, pf):
            continue
        group = _group(policy, pf)
        groups = [group]
        mtu, num_vfs = spec.mtu, spec.num_vfs
        old = state.get(pf.address)
        if old is not None:
            kept = [
                g
                for g in old.vf_groups
                if g.resource_name != group.resource_name and not g.overlaps(group)
            ]
            groups += kept
            if equal or kept:
                mtu, num_vfs = max(mtu, old.mtu), max(num_vfs, old.num_vfs)
        state[pf.address] = PfConfig(
            pci_address=pf.address,
            name=pf.netdev,
            num_vfs=num_vfs,
            mtu=mtu,
            link_type=spec.link_type,
            externally_managed=spec.externally_managed,
            vf_groups=tuple(groups),
        )
