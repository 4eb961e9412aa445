from __future__ import annotations

import copy
import itertools
from ipaddress import ip_address, ip_interface
from typing import Any

import pytest

from cni.errors import CNIError, ErrorCode
from cni.result import DNS, Interface, IPConfig, Result, Route
from cni.version import SUPPORTED_VERSIONS

# Wire layouts: 0 = 0.1/0.2 (ip4/ip6), 1 = 0.3.x/0.4.0 (ips[].version), 2 = 1.0.0, 3 = 1.1.0.
FORM = {"0.1.0": 0, "0.2.0": 0, "0.3.0": 1, "0.3.1": 1, "0.4.0": 1, "1.0.0": 2, "1.1.0": 3}

DNS_WIRE = {
    "nameservers": ["10.96.0.10"],
    "domain": "cluster.local",
    "search": ["default.svc.cluster.local"],
    "options": ["ndots:5"],
}

FULL_11: dict[str, Any] = {
    "interfaces": [
        {
            "name": "eth0",
            "mac": "0a:58:0a:00:00:05",
            "mtu": 1450,
            "sandbox": "/var/run/netns/x",
            "socketPath": "/run/vhost-user.sock",
            "pciID": "0000:01:10.1",
        },
        {"name": "veth1"},
    ],
    "ips": [
        {"interface": 0, "address": "10.0.0.5/24", "gateway": "10.0.0.1"},
        {"interface": 0, "address": "fd00::5/64", "gateway": "fd00::1"},
        {"interface": 0, "address": "10.0.1.5/24"},
        {"address": "fd01::5/64"},
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0",
            "gw": "10.0.0.1",
            "mtu": 1400,
            "advmss": 1360,
            "priority": 100,
            "table": 0,
            "scope": 0,
        },
        {"dst": "192.168.0.0/16"},
        {"dst": "::/0", "gw": "fd00::1", "table": 254},
    ],
    "dns": DNS_WIRE,
}

AS_10: dict[str, Any] = {
    "interfaces": [
        {"name": "eth0", "mac": "0a:58:0a:00:00:05", "sandbox": "/var/run/netns/x"},
        {"name": "veth1"},
    ],
    "ips": FULL_11["ips"],
    "routes": [
        {"dst": "0.0.0.0/0", "gw": "10.0.0.1"},
        {"dst": "192.168.0.0/16"},
        {"dst": "::/0", "gw": "fd00::1"},
    ],
    "dns": DNS_WIRE,
}

AS_02: dict[str, Any] = {
    "ip4": {
        "ip": "10.0.0.5/24",
        "gateway": "10.0.0.1",
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}, {"dst": "192.168.0.0/16"}],
    },
    "ip6": {"ip": "fd00::5/64", "gateway": "fd00::1", "routes": [{"dst": "::/0", "gw": "fd00::1"}]},
    "dns": DNS_WIRE,
}

# What survives of AS_02 in the newer layouts: no interfaces, `interface` unset.
LEGACY_UP: dict[str, Any] = {
    "ips": [
        {"address": "10.0.0.5/24", "gateway": "10.0.0.1"},
        {"address": "fd00::5/64", "gateway": "fd00::1"},
    ],
    "routes": AS_10["routes"],
    "dns": DNS_WIRE,
}


def with_ip_versions(body: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(body)
    for ip in out["ips"]:
        ip["version"] = "6" if ":" in ip["address"] else "4"
    return out


def as_version(body: dict[str, Any], version: str) -> dict[str, Any]:
    return {"cniVersion": version, **copy.deepcopy(body)}


SOURCE = {0: AS_02, 1: with_ip_versions(AS_10), 2: AS_10, 3: FULL_11}


def expected(src: str, dst: str) -> dict[str, Any]:
    """The wire form after src -> dst: the information of the poorer of the two layouts."""
    info, out = min(FORM[src], FORM[dst]), FORM[dst]
    if out == 0:
        body = AS_02
    elif info == 0:
        body = with_ip_versions(LEGACY_UP) if out == 1 else LEGACY_UP
    elif out == 1:
        body = with_ip_versions(AS_10)
    else:
        body = FULL_11 if info == 3 else AS_10
    return as_version(body, dst)


def full_result() -> Result:
    return Result.from_dict(as_version(FULL_11, "1.1.0"))


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_serialize_as_each_version(version: str) -> None:
    assert full_result().to_dict(version) == expected("1.1.0", version)


@pytest.mark.parametrize(("src", "dst"), itertools.product(SUPPORTED_VERSIONS, repeat=2))
def test_conversion_matrix(src: str, dst: str) -> None:
    result = Result.from_dict(as_version(SOURCE[FORM[src]], src))
    assert result.cni_version == src
    assert result.to_dict(dst) == expected(src, dst)
    converted = result.convert(dst)
    assert converted.cni_version == dst
    assert converted.to_dict(dst) == expected(src, dst)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_round_trip_is_stable(version: str) -> None:
    wire = full_result().to_dict(version)
    assert Result.from_dict(wire).to_dict(version) == wire


def test_ip_version_field_order_and_values() -> None:
    ips = full_result().to_dict("0.4.0")["ips"]
    assert [ip["version"] for ip in ips] == ["4", "6", "4", "6"]
    assert list(ips[0]) == ["version", "interface", "address", "gateway"]
    assert all("version" not in ip for ip in full_result().to_dict("1.0.0")["ips"])


def test_legacy_keeps_first_ip_of_each_family() -> None:
    result = Result(
        cni_version="1.0.0",
        ips=[
            IPConfig(address=ip_interface("fd00::9/64")),
            IPConfig(address=ip_interface("10.1.0.9/16"), gateway=ip_address("10.1.0.1")),
            IPConfig(address=ip_interface("10.2.0.9/16")),
            IPConfig(address=ip_interface("fd00::10/64")),
        ],
        routes=[Route(dst="10.3.0.0/16"), Route(dst="fd10::/16", gw="fd00::1")],
    )
    assert result.to_dict("0.2.0") == {
        "cniVersion": "0.2.0",
        "ip4": {"ip": "10.1.0.9/16", "gateway": "10.1.0.1", "routes": [{"dst": "10.3.0.0/16"}]},
        "ip6": {"ip": "fd00::9/64", "routes": [{"dst": "fd10::/16", "gw": "fd00::1"}]},
        "dns": {},
    }


def test_legacy_with_a_single_family() -> None:
    result = Result(cni_version="1.0.0", ips=[IPConfig(address=ip_interface("fd00::9/64"))])
    assert result.to_dict("0.1.0") == {
        "cniVersion": "0.1.0",
        "ip6": {"ip": "fd00::9/64"},
        "dns": {},
    }


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_legacy_without_ips_fails(version: str) -> None:
    result = Result(cni_version="1.0.0", interfaces=[Interface(name="eth0")])
    with pytest.raises(CNIError) as exc:
        result.to_dict(version)
    assert exc.value.code == ErrorCode.INCOMPATIBLE_VERSION
    assert "no IP addresses" in exc.value.msg
    with pytest.raises(CNIError):
        result.convert(version)


def test_empty_result_keeps_dns_object() -> None:
    assert Result(cni_version="1.0.0").to_dict("1.0.0") == {"cniVersion": "1.0.0", "dns": {}}
    assert Result().cni_version == "1.1.0"


def test_zero_route_attributes_follow_libcni_omitempty() -> None:
    route = Route(dst="10.0.0.0/8", mtu=0, advmss=0, priority=0, table=0, scope=0)
    wire = Result(cni_version="1.1.0", routes=[route]).to_dict("1.1.0")
    assert wire["routes"] == [{"dst": "10.0.0.0/8", "table": 0, "scope": 0}]


def test_missing_cni_version_means_0_1_0() -> None:
    result = Result.from_dict({"ip4": {"ip": "10.0.0.2/24"}})
    assert result.cni_version == "0.1.0"
    assert result.ip_strings() == ["10.0.0.2"]


def test_reads_host_local_legacy_output() -> None:
    wire = {
        "cniVersion": "0.2.0",
        "ip4": {
            "ip": "10.9.0.3/24",
            "gateway": "10.9.0.1",
            "routes": [{"dst": "0.0.0.0/0"}],
        },
        "ip6": {"ip": "fd00::3/64", "gateway": "fd00::1"},
        "dns": {},
    }
    result = Result.from_dict(wire)
    assert result.to_dict("0.2.0") == wire
    assert result.to_dict("1.0.0") == {
        "cniVersion": "1.0.0",
        "ips": [
            {"address": "10.9.0.3/24", "gateway": "10.9.0.1"},
            {"address": "fd00::3/64", "gateway": "fd00::1"},
        ],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {},
    }


def test_route_dst_with_host_bits_is_accepted() -> None:
    result = Result.from_dict({"cniVersion": "1.0.0", "routes": [{"dst": "10.1.2.3/8"}]})
    assert result.to_dict("1.0.0")["routes"] == [{"dst": "10.0.0.0/8"}]


def test_unknown_fields_are_ignored() -> None:
    result = Result.from_dict(
        {"cniVersion": "1.0.0", "extra": 1, "ips": [{"address": "10.0.0.1/8"}]}
    )
    assert result.to_dict("1.0.0") == {
        "cniVersion": "1.0.0",
        "ips": [{"address": "10.0.0.1/8"}],
        "dns": {},
    }


@pytest.mark.parametrize(
    "data",
    [
        {"cniVersion": "1.0.0", "ips": [{"address": "not-an-ip"}]},
        {"cniVersion": "1.0.0", "ips": [{"gateway": "10.0.0.1"}]},
        {"cniVersion": "1.0.0", "interfaces": [{"mac": "aa"}]},
        {"cniVersion": "1.0.0", "routes": [{"dst": "10.0.0.0/99"}]},
        {"cniVersion": "0.2.0", "ip4": "10.0.0.1/24"},
        {"cniVersion": "0.4.0", "ips": {}},
        {"cniVersion": 1},
    ],
)
def test_bad_data_is_a_decode_failure(data: dict[str, Any]) -> None:
    with pytest.raises(CNIError) as exc:
        Result.from_dict(data)
    assert exc.value.code == ErrorCode.DECODE_FAILURE


def test_not_a_mapping_is_a_decode_failure() -> None:
    with pytest.raises(CNIError) as exc:
        Result.from_dict([])  # type: ignore[arg-type]
    assert exc.value.code == ErrorCode.DECODE_FAILURE


@pytest.mark.parametrize("version", ["0.5.0", "2.0.0"])
def test_unknown_version_is_incompatible(version: str) -> None:
    with pytest.raises(CNIError) as exc:
        Result.from_dict({"cniVersion": version})
    assert exc.value.code == ErrorCode.INCOMPATIBLE_VERSION
    with pytest.raises(CNIError) as exc:
        full_result().to_dict(version)
    assert exc.value.code == ErrorCode.INCOMPATIBLE_VERSION


def test_ip_strings_by_interface() -> None:
    result = full_result()
    assert result.ip_strings() == ["10.0.0.5", "fd00::5", "10.0.1.5", "fd01::5"]
    assert result.ip_strings(0) == ["10.0.0.5", "fd00::5", "10.0.1.5"]
    assert result.ip_strings(1) == []


def test_models_accept_field_names_and_aliases() -> None:
    iface = Interface(name="eth0", socket_path="/s", pci_id="0000:00:01.0")
    assert (
        Interface.model_validate({"name": "eth0", "socketPath": "/s", "pciID": "0000:00:01.0"})
        == iface
    )
    assert DNS().model_dump() == {"nameservers": [], "domain": "", "search": [], "options": []}


def _edge_results() -> list[Result]:
    """Results whose convert could go wrong: every field set, zeros, nothing at all."""
    zeros = Result(
        cni_version="1.1.0",
        interfaces=[Interface(name="eth0", mtu=0)],
        ips=[IPConfig(address=ip_interface("10.0.0.5/24"), interface=0)],
        routes=[Route(dst="10.0.0.0/8", mtu=0, advmss=0, priority=0, table=0, scope=0)],
    )
    sources = [Result.from_dict(as_version(SOURCE[FORM[v]], v)) for v in SUPPORTED_VERSIONS]
    return [full_result(), zeros, Result(cni_version="1.0.0"), *sources]


@pytest.mark.parametrize("version", [v for v in SUPPORTED_VERSIONS if FORM[v] > 0])
def test_convert_reads_what_the_wire_form_would(version: str) -> None:
    for result in _edge_results():
        assert result.convert(version) == Result.from_dict(result.to_dict(version))


def test_a_converted_result_shares_nothing_mutable_with_the_original() -> None:
    result = full_result()
    converted = result.convert("1.1.0")
    converted.dns.nameservers.append("10.0.0.53")
    converted.routes[0].gw = None
    converted.interfaces[0].name = "net9"
    converted.ips[0].gateway = None
    converted.ips.pop()
    assert result.to_dict("1.1.0") == expected("1.1.0", "1.1.0")


def test_null_fields_read_as_absent_as_libcni_does() -> None:
    """Go's decoder leaves a field at its zero value for JSON null."""
    result = Result.from_dict(
        {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mac": None, "mtu": None, "sandbox": None}],
            "ips": [{"address": "10.1.0.2/24", "gateway": None, "interface": None}],
            "routes": None,
            "dns": {"nameservers": None, "domain": None},
        }
    )
    assert result.to_dict("1.1.0") == {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0"}],
        "ips": [{"address": "10.1.0.2/24"}],
        "dns": {},
    }
    legacy = Result.from_dict({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24", "routes": None}})
    assert legacy.ip_strings() == ["10.0.0.2"]
