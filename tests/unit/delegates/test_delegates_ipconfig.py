"""The pure parts of delegates.ipconfig: gateways, interface indexes, route matching."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

import pytest

from cni.errors import CNIError
from cni.result import Result
from delegates.ipconfig import _own_ips, _route_present, default_gateways


def _result(**extra: object) -> Result:
    data = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0"}],
        "ips": [
            {"address": "10.0.0.5/24", "interface": 0},
            {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0},
            {"address": "10.2.0.5/24", "gateway": "10.2.0.1", "interface": 0},
            {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 0},
        ],
        **extra,
    }
    return Result.from_dict(data)


def test_first_gateway_of_each_family() -> None:
    gws = default_gateways(_result(), "eth0")
    assert gws == {4: ip_address("10.1.0.1"), 6: ip_address("fd00::1")}


def test_ips_without_interface_are_skipped_and_bad_indexes_fail() -> None:
    result = _result()
    result.ips[0].interface = None
    assert len(_own_ips(result, "eth0")) == 3
    result.ips[1].interface = 3
    with pytest.raises(CNIError, match="invalid interface index"):
        _own_ips(result, "eth0")
    with pytest.raises(CNIError, match="invalid interface index"):
        _own_ips(_result(), "net1")


def test_route_matching() -> None:
    gws = {4: ip_address("10.1.0.1")}
    route = _result(routes=[{"dst": "10.9.0.0/16"}]).routes[0]
    installed: list[tuple[object, object]] = [(ip_network("10.9.0.0/16"), ip_address("10.1.0.1"))]
    assert _route_present(route, gws, installed)
    assert not _route_present(route, {}, installed)
    default = _result(routes=[{"dst": "0.0.0.0/0", "gw": "10.7.0.1"}]).routes[0]
    assert _route_present(default, gws, [(ip_network("0.0.0.0/0"), ip_address("10.1.0.1"))])
    assert not _route_present(default, gws, installed)
