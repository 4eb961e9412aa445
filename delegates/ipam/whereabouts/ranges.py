"""whereabouts' range math: the usable window, exclusions, offsets and object names.

Addresses are handled as integers. A range allocates from its network's first usable
address (network + 1) to its last (broadcast - 1), narrowed by `range_start` /
`range_end` only when they lie inside that window (else silently ignored, as whereabouts
does); /31, /32, /127 and /128 have no usable address. An `exclude` entry (a CIDR or a
bare IP) removes its whole subnet, network and broadcast addresses included. The lowest
free address wins. A pool stores each allocation under the decimal offset of its address
from the range's network address; offsets whereabouts could not read back (not plain
decimal, or past 2^63) are ignored.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from delegates.ipam.common import IPAddress, parse_cidr, parse_ip

Network = IPv4Network | IPv6Network

MAX_OFFSET = 2**63 - 1
"""whereabouts reads offsets with strconv.ParseInt(key, 10, 64)."""


class RangeError(ValueError):
    """A range that cannot be allocated from; the message is whereabouts'."""


@dataclass(frozen=True)
class IPRange:
    """One range of a config: its network, the configured bounds and exclusions."""

    network: Network
    range_start: IPAddress | None = None
    range_end: IPAddress | None = None
    exclude: tuple[str, ...] = ()
    subnet_prefix: int = 0
    """The prefix length addresses are given with, when not the network's: a node slice's
    addresses keep the whole range's (the slice is where they come from, not their subnet)."""

    @property
    def prefixlen(self) -> int:
        """The prefix length of the addresses this range gives."""
        return self.subnet_prefix or self.network.prefixlen

    @property
    def cidr(self) -> str:
        """The range as a pool's `spec.range` holds it: the normalised CIDR."""
        return str(self.network)

    def window(self) -> tuple[int, int]:
        """The first and last allocatable address (inclusive); RangeError if none."""
        net = self.network
        if net.max_prefixlen - net.prefixlen <= 1:
            raise RangeError(
                f"net mask is too short, subnet {net} has no usable IP addresses, it is too small"
            )
        first = int(net.network_address) + 1
        last = int(net.broadcast_address) - 1
        start = _as_int(self.range_start, net)
        if start is not None and first <= start <= last:
            first = start
        end = _as_int(self.range_end, net)
        if end is not None and first <= end <= last:
            last = end
        return first, last

    def excluded(self) -> list[tuple[int, int]]:
        """The excluded subnets as (first, last) integers; RangeError for a bad entry."""
        spans = []
        for text in self.exclude:
            subnet = parse_exclude(text)
            if subnet is None:
                raise RangeError(
                    f'could not parse exclude range, err: "invalid CIDR address: {text}"'
                )
            spans.append((int(subnet.network_address), int(subnet.broadcast_address)))
        return spans

    def address(self, value: int) -> IPAddress:
        """The address `value` (an integer) in this range's family."""
        return IPv4Address(value) if self.network.version == 4 else IPv6Address(value)

    def offset(self, value: int) -> str:
        """The pool key of address `value`: its decimal offset from the network address."""
        return str(value - int(self.network.network_address))

    def from_offset(self, key: str) -> int | None:
        """The address a pool key names, or None if whereabouts would not read it."""
        if not key.isascii() or not key.isdigit():
            return None
        offset = int(key)
        if offset > MAX_OFFSET:
            return None
        return int(self.network.network_address) + offset

    def first_free(self, used: Collection[int]) -> int | None:
        """The lowest allocatable address not in `used` and not excluded, or None."""
        first, last = self.window()
        spans = self.excluded()
        value = first
        while value <= last:
            if value in used:
                value += 1
                continue
            skip = next((hi for lo, hi in spans if lo <= value <= hi), None)
            if skip is not None:
                value = skip + 1
                continue
            return value
        return None

    def exhausted(self) -> str:
        """whereabouts' message for a range with no address left."""
        first, last = self.window()
        excluded = " ".join(self.exclude)
        return (
            f"Could not allocate IP in range: ip: {self.address(first)} / - "
            f"{self.address(last)} / range: {self.network} / excludeRanges: [{excluded}]"
        )

    def allocatable(self) -> int:
        """How many addresses the window holds once exclusions are taken out."""
        first, last = self.window()
        size = last - first + 1
        for lo, hi in _merged(self.excluded()):
            size -= max(0, min(hi, last) - max(lo, first) + 1)
        return size


def _as_int(addr: IPAddress | None, net: Network) -> int | None:
    if addr is None or addr.version != net.version:
        return None
    return int(addr)


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def parse_exclude(text: str) -> Network | None:
    """An `exclude` entry: a CIDR (host bits masked off) or a bare IP (a /32 or /128)."""
    cidr = parse_cidr(text)
    if cidr is not None:
        return cidr.network
    addr = parse_ip(text)
    if addr is None:
        return None
    return ip_network(f"{addr}/{addr.max_prefixlen}")


def normalize_range(cidr: str) -> str:
    """A CIDR as an object name part: ':' and '/' become '-' (a trailing ':' gets a 0)."""
    if cidr.endswith(":"):
        cidr += "0"
    return cidr.replace(":", "-").replace("/", "-")


def pool_name(cidr: str, network_name: str = "", node: str = "") -> str:
    """The IPPool of a range (of a node's slice when `node` is set), as whereabouts names it."""
    parts = [p for p in (network_name, node) if p]
    return "-".join([*parts, normalize_range(cidr)])


def reservation_name(addr: IPAddress, network_name: str = "") -> str:
    """The OverlappingRangeIPReservation of an address, as whereabouts names it."""
    text = str(addr)
    if text.endswith(":"):
        text += "0"
    text = text.replace(":", "-")
    return f"{network_name}-{text}" if network_name else text


def parse_cidr_sloppy(text: str) -> tuple[IPAddress, Network] | None:
    """k8s.io/utils/net.ParseCIDRSloppy: (the address, its network with host bits off)."""
    addr_text, sep, prefix = text.partition("/")
    addr = parse_ip_sloppy(addr_text)
    if addr is None or not sep or not prefix.isascii() or not prefix.isdigit():
        return None
    if int(prefix) > addr.max_prefixlen:
        return None
    return addr, ip_network(f"{addr}/{int(prefix)}", strict=False)


def parse_ip_sloppy(text: str) -> IPAddress | None:
    """k8s.io/utils/net.ParseIPSloppy: Go's ParseIP, but IPv4 parts may have leading zeros
    (read as decimal)."""
    parts = text.split(".")
    if len(parts) == 4 and all(p.isascii() and p.isdigit() for p in parts):
        values = [int(p) for p in parts]
        if all(v <= 255 for v in values):
            return ip_address(".".join(str(v) for v in values))
        return None
    if ":" in text and "." in text:  # an IPv6 address ending in a dotted quad
        head, _, quad = text.rpartition(":")
        tail = parse_ip_sloppy(quad)
        return parse_ip(f"{head}:{tail}") if isinstance(tail, IPv4Address) else None
    return parse_ip(text)
