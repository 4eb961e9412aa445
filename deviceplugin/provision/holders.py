"""Which VFs are in use, by whom, and under which resource.

Three sources, all on the node: the kubelet's device allocations (its PodResources API, or
its checkpoint file while that is down: read by the caller's `KubeletDevices`, which
meta/cli.py wires from meta/podresources since this package sits below meta), the DRA
driver's prepared claims (deviceplugin/dra/state.py), and the kernel: a VF whose netdev is
gone from this namespace although a kernel network driver holds it sits in some pod's
namespace even if neither knows it (its holder is then unknown and nothing is evicted for
it). The pods behind a claim or a bare UID are found through the API when one must go.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from deviceplugin.dra.state import PreparedState
from deviceplugin.provision.plan import in_a_pod
from deviceplugin.sysfs import PciNetDevice

log = logging.getLogger("plexus.provision")


@dataclass(frozen=True)
class KubeletAllocation:
    """One pod's devices of one resource, as the kubelet allocated them."""

    namespace: str  # "" (with `name`) when only the checkpoint file answered
    name: str
    uid: str  # "" when PodResources answered (it does not say)
    resource: str
    device_ids: tuple[str, ...]


KubeletDevices = Callable[[], list[KubeletAllocation]]


class HolderError(RuntimeError):
    """A source of allocations could not answer; the VFs must count as possibly in use."""


@dataclass(frozen=True)
class Holder:
    """Who holds a VF: a pod (by name or UID), a DRA claim, or an unknown holder."""

    resource: str = ""  # what it was allocated as; "" when unknown
    namespace: str = ""
    name: str = ""
    uid: str = ""
    claim: bool = False  # namespace/name/uid are a ResourceClaim's, not a pod's

    def __str__(self) -> str:
        if self.claim:
            return f"claim {self.namespace}/{self.name}"
        if self.name:
            return f"pod {self.namespace}/{self.name}"
        return f"pod {self.uid}" if self.uid else "an unknown holder (netdev in another namespace)"


Allocations = dict[str, set[Holder]]  # VF address -> holders


def kubelet_allocations(devices: KubeletDevices) -> Allocations:
    out: Allocations = {}
    try:
        listed = devices()
    except Exception as exc:  # any failure of the kubelet's answer: assume everything in use
        raise HolderError(f"the kubelet's device allocations are unavailable: {exc}") from exc
    for entry in listed:
        holder = Holder(entry.resource, entry.namespace, entry.name, entry.uid)
        for device in entry.device_ids:
            out.setdefault(device, set()).add(holder)
    return out


def dra_allocations(state_dir: Path | None) -> Allocations:
    """The VFs of claims the DRA driver has prepared and not yet unprepared."""
    out: Allocations = {}
    if state_dir is None:
        return out
    state = PreparedState(state_dir)
    try:
        names = sorted(os.listdir(state_dir))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            claim = state.get(name.removesuffix(".json"))
        except (OSError, ValueError, json.JSONDecodeError) as exc:
            raise HolderError(f"DRA prepared claim {name}: {exc}") from exc
        if claim is None:
            continue
        for dev in claim.devices:
            holder = Holder(dev.resource, claim.namespace, claim.name, claim.uid, claim=True)
            out.setdefault(dev.address, set()).add(holder)
    return out


def kernel_allocations(devices: Iterable[PciNetDevice]) -> Allocations:
    return {d.address: {Holder()} for d in devices if d.is_vf and in_a_pod(d)}


def combine(*sources: Allocations) -> Allocations:
    out: Allocations = {}
    for source in sources:
        for address, holders in source.items():
            out.setdefault(address, set()).update(holders)
    return out


class AllocationReader:
    """All three sources at once; what a failing one last said is kept, and reported."""

    def __init__(self, kubelet: KubeletDevices | None, dra_state: Path | None) -> None:
        self.kubelet = kubelet
        self.dra_state = dra_state
        self.problem = ""  # why the last read is incomplete, "" when it is not

    def read(self, devices: Sequence[PciNetDevice]) -> Allocations:
        parts = [kernel_allocations(devices)]
        problems = []
        for name in ("kubelet", "dra"):
            try:
                if name == "kubelet":
                    parts.append(kubelet_allocations(self.kubelet) if self.kubelet else {})
                else:
                    parts.append(dra_allocations(self.dra_state))
            except HolderError as exc:
                problems.append(str(exc))
                log.warning("allocations from the %s unknown: %s", name, exc)
        self.problem = "; ".join(problems)
        found = combine(*parts)
        for holders in found.values():
            if len(holders) > 1:
                holders.discard(Holder())  # the kernel's guess, once a source names the holder
        return found
