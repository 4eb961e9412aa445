"""host-local ranges and range sets: validation, membership and the allocation order.

A range is a subnet plus an inclusive [start, end] and a gateway; a range set is a list of
ranges of one family that yields one address per ADD. Defaults, checks and messages follow
the reference host-local 1.1.1: start defaults to the network address + 1, end to the last
address (the one before the broadcast address for IPv4), gateway to network + 1; the
gateway need not lie in the subnet, and an explicit start/end may be the network or
broadcast address.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Address, IPv6Network
from typing import Protocol

from delegates.ipam.common import IPAddress, IPInterface


class RangeError(ValueError):
    """A range or range set that host-local refuses; the message is the reference's."""


@dataclass(frozen=True)
class Range:
    """A validated range: every field is set."""

    subnet: IPv4Network | IPv6Network
    start: IPAddress
    end: IPAddress
    gateway: IPAddress

    def contains(self, addr: IPAddress) -> bool:
        """True if `addr` is in the subnet and within [start, end]."""
        return (
            addr.version == self.subnet.version
            and addr in self.subnet
            and self.start <= addr <= self.end  # type: ignore[operator]
        )

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


def _within(
    addr: IPAddress,
    subnet: IPv4Network | IPv6Network,
    low: IPAddress | None,
    high: IPAddress | None,
) -> bool:
    if addr.version != subnet.version or addr not in subnet:
        return False
    return (low is None or low <= addr) and (high is None or addr <= high)  # type: ignore[operator]


def make_range(
    subnet: IPInterface | None,
    start: IPAddress | None = None,
    end: IPAddress | None = None,
    gateway: IPAddress | None = None,
) -> Range:
    """Validate one range and fill in its defaults; RangeError with the reference message."""
    if subnet is None:
        raise RangeError("IP <nil> not v4 nor v6")
    host, prefix, bits = subnet.ip, subnet.network.prefixlen, subnet.max_prefixlen
    if prefix > bits - 2:
        raise RangeError(f"Network {host}/{prefix} too small to allocate from")
    if isinstance(host, IPv6Address) and host.ipv4_mapped is not None:
        raise RangeError("IPNet IP and Mask version mismatch")
    network = subnet.network
    if host != network.network_address:
        raise RangeError(
            f"Network has host bits set. For a subnet mask of length {prefix} "
            f"the network address is {network.network_address}"
        )
    first = network.network_address + 1
    if start is not None and not _within(start, network, start, end):
        raise RangeError(f"RangeStart {start} not in network {network}")
    start = first if start is None else start
    if end is not None and not _within(end, network, start, end):
        raise RangeError(f"RangeEnd {end} not in network {network}")
    if end is None:
        last = network.broadcast_address
        end = last - 1 if network.version == 4 else last
    return Range(network, start, end, first if gateway is None else gateway)


def _overlaps(a: Range, b: Range) -> bool:
    if a.subnet.version != b.subnet.version:
        return False
    return a.contains(b.start) or a.contains(b.end) or b.contains(a.start) or b.contains(a.end)


class RangeSpec(Protocol):
    """An unvalidated range as configured."""

    @property
    def subnet(self) -> IPInterface | None: ...
    @property
    def range_start(self) -> IPAddress | None: ...
    @property
    def range_end(self) -> IPAddress | None: ...
    @property
    def gateway(self) -> IPAddress | None: ...


def make_range_set(specs: Sequence[RangeSpec]) -> list[Range]:
    """Validate a range set: non-empty, one family, no overlaps (RangeError)."""
    if not specs:
        raise RangeError("empty range set")
    ranges: list[Range] = []
    for spec in specs:
        ranges.append(make_range(spec.subnet, spec.range_start, spec.range_end, spec.gateway))
        if ranges[-1].subnet.version != ranges[0].subnet.version:
            raise RangeError("mixed address families")
    for i, first in enumerate(ranges):
        for second in ranges[i + 1 :]:
            if _overlaps(first, second):
                raise RangeError(f"subnets {first} and {second} overlap")
    return ranges


def sets_overlap(a: Sequence[Range], b: Sequence[Range]) -> bool:
    """True if any range of `a` overlaps any range of `b`."""
    return any(_overlaps(x, y) for x in a for y in b)


def range_for(ranges: Sequence[Range], addr: IPAddress) -> Range | None:
    """The first range of the set that contains `addr`."""
    return next((r for r in ranges if r.contains(addr)), None)


def set_string(ranges: Sequence[Range]) -> str:
    """The set as the reference prints it: "start-end,start-end"."""
    return ",".join(str(r) for r in ranges)


def candidates(
    ranges: Sequence[Range], last: IPAddress | None
) -> Iterator[tuple[IPAddress, Range]]:
    """Every allocatable address once, in the reference's round-robin order.

    Starts right after `last` (the last reserved IP) when the set contains it, else at the
    first range's start; walks each range to its end, moves on to the next range (wrapping
    around) and skips gateways.
    """
    idx = 0
    cur: IPAddress | None = None
    first: IPAddress | None = None
    if last is not None:
        for i, r in enumerate(ranges):
            if r.contains(last):
                idx, cur = i, last
                break
    if cur is None:
        r = ranges[0]
        cur = first = r.start
        if cur != r.gateway:
            yield cur, r
    while True:
        r = ranges[idx]
        if cur == r.end:
            idx = (idx + 1) % len(ranges)
            r = ranges[idx]
            cur = r.start
        else:
            cur = cur + 1
        if first is None:
            first = cur
        elif cur == first:
            return
        if cur != r.gateway:
            yield cur, r
