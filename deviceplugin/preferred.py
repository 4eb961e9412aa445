"""GetPreferredAllocation: keep a request on one NUMA node and as few PFs as possible.

The devices the kubelet must include come first. The target NUMA node is the one most
of those sit on, else the one with the most available devices. The rest are ranked:
on the target node before off it, then PFs already used by the pick, then PFs with more
available devices (so a request fills one PF before spilling), then PCI address.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from deviceplugin.sysfs import PciNetDevice


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    pool: Mapping[str, PciNetDevice],
) -> list[str]:
    """`size` IDs out of `available`, with every ID of `must_include`; deterministic."""
    chosen = list(dict.fromkeys(must_include))
    rest = sorted({i for i in available if i not in chosen})
    if len(chosen) >= size or not rest:
        return chosen[: max(size, len(chosen))]

    def numa(device_id: str) -> int | None:
        dev = pool.get(device_id)
        return dev.numa_node if dev else None

    def pf(device_id: str) -> str:
        dev = pool.get(device_id)
        return (dev.pf_address or dev.address) if dev else device_id

    on_chosen = Counter(numa(i) for i in chosen)
    target = (on_chosen or Counter(numa(i) for i in rest)).most_common(1)[0][0]
    used_pfs = {pf(i) for i in chosen}
    per_pf = Counter(pf(i) for i in rest if numa(i) == target)

    def rank(device_id: str) -> tuple[bool, bool, int, str]:
        p = pf(device_id)
        return (numa(device_id) != target, p not in used_pfs, -per_pf[p], device_id)

    return chosen + sorted(rest, key=rank)[: size - len(chosen)]
