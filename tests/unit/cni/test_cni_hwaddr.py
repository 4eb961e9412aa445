"""cni.hwaddr: which hardware addresses no station (a pod's interface) may have."""

from __future__ import annotations

import pytest

from cni.hwaddr import station_problem


@pytest.mark.parametrize(
    "mac", ["02:00:00:00:00:01", "00-1B-21-3A-4F-5E", "0200.0000.0001", "02:00:00:00:00:00:00:01"]
)
def test_unicast_addresses_are_fine(mac: str) -> None:
    assert station_problem(mac) is None


@pytest.mark.parametrize(
    ("mac", "problem"),
    [
        ("01:00:5e:00:00:fb", "is a multicast address (its first octet is odd)"),
        ("33-33-00-00-00-01", "is a multicast address (its first octet is odd)"),
        ("0100.5e00.00fb", "is a multicast address (its first octet is odd)"),
        ("00:00:00:00:00:00", "is all zeros"),
        ("00:00:00:00:00:00:00:00", "is all zeros"),
        ("FF:FF:FF:FF:FF:FF", "is the broadcast address"),
    ],
)
def test_what_no_station_may_have(mac: str, problem: str) -> None:
    assert station_problem(mac) == f'"{mac}" {problem}: not a station address'


def test_an_ipoib_address_has_no_group_bit_to_check() -> None:
    assert station_problem(":".join(["ff"] * 20)) is None
