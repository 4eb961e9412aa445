"""Range validation, membership and the round-robin allocation order."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import ip_address, ip_interface

import pytest

from delegates.ipam.common import IPAddress, IPInterface
from delegates.ipam.ranges import (
    RangeError,
    candidates,
    make_range,
    make_range_set,
    range_for,
    set_string,
)


def ip(text: str) -> IPAddress:
    return ip_address(text)


@dataclass
class Spec:
    subnet: IPInterface | None
    range_start: IPAddress | None = None
    range_end: IPAddress | None = None
    gateway: IPAddress | None = None


def spec(subnet: str, start: str = "", end: str = "", gateway: str = "") -> Spec:
    return Spec(
        ip_interface(subnet),
        ip(start) if start else None,
        ip(end) if end else None,
        ip(gateway) if gateway else None,
    )


def test_v4_defaults_skip_network_and_broadcast() -> None:
    r = make_range(ip_interface("10.1.2.0/24"))
    assert (str(r.start), str(r.end), str(r.gateway)) == ("10.1.2.1", "10.1.2.254", "10.1.2.1")
    assert str(r) == "10.1.2.1-10.1.2.254"
    assert not r.contains(ip("10.1.2.0")) and not r.contains(ip("10.1.2.255"))
    assert r.contains(ip("10.1.2.254")) and not r.contains(ip("fd00::1"))


def test_v6_defaults_include_last_address() -> None:
    r = make_range(ip_interface("fd00::/120"))
    assert (str(r.start), str(r.end), str(r.gateway)) == ("fd00::1", "fd00::ff", "fd00::1")


def test_explicit_bounds_may_be_network_or_broadcast_and_gateway_anywhere() -> None:
    r = make_range(ip_interface("10.1.2.0/24"), ip("10.1.2.0"), ip("10.1.2.255"), ip("10.9.9.9"))
    assert r.contains(ip("10.1.2.0")) and r.contains(ip("10.1.2.255"))
    assert str(r.gateway) == "10.9.9.9"


@pytest.mark.parametrize(
    ("subnet", "start", "end", "message"),
    [
        (None, None, None, "IP <nil> not v4 nor v6"),
        ("10.1.2.0/31", None, None, "Network 10.1.2.0/31 too small to allocate from"),
        ("fd00::/127", None, None, "Network fd00::/127 too small to allocate from"),
        (
            "10.1.2.3/24",
            None,
            None,
            "Network has host bits set. For a subnet mask of length 24 the network address is "
            "10.1.2.0",
        ),
        ("10.1.2.0/24", "10.1.3.5", None, "RangeStart 10.1.3.5 not in network 10.1.2.0/24"),
        ("10.1.2.0/24", "fd00::1", None, "RangeStart fd00::1 not in network 10.1.2.0/24"),
        ("10.1.2.0/24", None, "10.1.3.5", "RangeEnd 10.1.3.5 not in network 10.1.2.0/24"),
        ("10.1.2.0/24", "10.1.2.50", "10.1.2.40", "RangeStart 10.1.2.50 not in network"),
        ("::ffff:10.1.2.0/120", None, None, "IPNet IP and Mask version mismatch"),
    ],
)
def test_invalid_ranges(
    subnet: str | None, start: str | None, end: str | None, message: str
) -> None:
    with pytest.raises(RangeError, match=message):
        make_range(
            ip_interface(subnet) if subnet else None,
            ip(start) if start else None,
            ip(end) if end else None,
        )


def test_range_set_validation() -> None:
    with pytest.raises(RangeError, match="empty range set"):
        make_range_set([])
    with pytest.raises(RangeError, match="mixed address families"):
        make_range_set([spec("10.1.2.0/24"), spec("fd00::/64")])
    with pytest.raises(
        RangeError, match=r"subnets 10\.1\.2\.1-10\.1\.2\.254 and 10\.1\.2\.1-10\.1\.2\.126"
    ):
        make_range_set([spec("10.1.2.0/24"), spec("10.1.2.0/25")])
    ok = make_range_set([spec("10.1.2.0/25"), spec("10.1.2.128/25")])
    assert set_string(ok) == "10.1.2.1-10.1.2.126,10.1.2.129-10.1.2.254"
    assert range_for(ok, ip("10.1.2.200")) is ok[1]
    assert range_for(ok, ip("10.1.2.127")) is None


def order(specs: list[Spec], last: str | None = None, limit: int = 100) -> list[str]:
    ranges = make_range_set(specs)
    out = []
    for addr, _ in candidates(ranges, ip(last) if last else None):
        out.append(str(addr))
        if len(out) == limit:
            break
    return out


def test_order_from_start_skips_gateway() -> None:
    assert order([spec("10.1.2.0/29")]) == [f"10.1.2.{i}" for i in range(2, 7)]
    got = order([spec("10.1.2.0/29", gateway="10.1.2.4")])
    assert got == ["10.1.2.1", "10.1.2.2", "10.1.2.3", "10.1.2.5", "10.1.2.6"]


def test_order_resumes_after_last_reserved_and_wraps() -> None:
    got = order([spec("10.1.2.0/29")], last="10.1.2.4")
    assert got == ["10.1.2.5", "10.1.2.6", "10.1.2.2", "10.1.2.3", "10.1.2.4"]
    # a last reserved IP outside the set restarts at the beginning
    assert order([spec("10.1.2.0/29")], last="10.9.9.9")[0] == "10.1.2.2"


def test_order_walks_ranges_in_turn() -> None:
    specs = [spec("10.1.0.0/30"), spec("10.1.1.0/29", start="10.1.1.5")]
    assert order(specs) == ["10.1.0.2", "10.1.1.5", "10.1.1.6"]
    assert order(specs, last="10.1.1.5") == ["10.1.1.6", "10.1.0.2", "10.1.1.5"]


def test_order_v6_visits_last_address() -> None:
    got = order([spec("fd00::/126")])
    assert got == ["fd00::2", "fd00::3"]
    assert order([spec("fd00::/64")], last="fd00::ffff:ffff:ffff:fffe", limit=3) == [
        "fd00::ffff:ffff:ffff:ffff",
        "fd00::2",
        "fd00::3",
    ]


def test_order_only_gateway_is_empty() -> None:
    assert order([spec("10.1.2.0/24", start="10.1.2.1", end="10.1.2.1")]) == []
