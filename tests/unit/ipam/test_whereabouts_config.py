"""whereabouts' config, range math and object names (delegates/ipam/whereabouts)."""

from __future__ import annotations

import json
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

import pytest

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from delegates.ipam.whereabouts.config import WhereaboutsConfig, load_config
from delegates.ipam.whereabouts.ranges import (
    IPRange,
    RangeError,
    parse_ip_sloppy,
    pool_name,
    reservation_name,
)


def conf(ipam: dict[str, Any], version: str = "1.0.0") -> dict[str, Any]:
    return {
        "cniVersion": version,
        "name": "net",
        "type": "macvlan",
        "ipam": {"type": "whereabouts", **ipam},
    }


def load(
    ipam: dict[str, Any], env: str = "", root: str = "", version: str = "1.0.0"
) -> WhereaboutsConfig:
    pairs = tuple(tuple(p.split("=", 1)) for p in env.split(";") if p)
    args = CmdArgs("ADD", "c", "/x", "net1", pairs, (), b"")  # type: ignore[arg-type]
    return load_config(conf(ipam, version), args, root)


def window(cfg: WhereaboutsConfig, i: int = 0) -> tuple[str, str]:
    first, last = cfg.ranges[i].window()
    return str(cfg.ranges[i].address(first)), str(cfg.ranges[i].address(last))


@pytest.mark.parametrize(
    ("cidr", "network_name", "node", "name"),
    [
        ("10.0.0.0/24", "", "", "10.0.0.0-24"),
        ("10.0.0.0/24", "net1", "", "net1-10.0.0.0-24"),
        ("2001::/116", "", "", "2001---116"),
        ("fd00:1:2::/64", "net1", "", "net1-fd00-1-2---64"),
        ("10.0.4.0/24", "net1", "node-a", "net1-node-a-10.0.4.0-24"),
    ],
)
def test_pool_names(cidr: str, network_name: str, node: str, name: str) -> None:
    assert pool_name(cidr, network_name, node) == name


@pytest.mark.parametrize(
    ("ip", "network_name", "name"),
    [
        ("10.0.0.5", "", "10.0.0.5"),
        ("2001::1", "", "2001--1"),
        ("2001::", "", "2001--0"),
        ("10.0.0.5", "net1", "net1-10.0.0.5"),
    ],
)
def test_reservation_names(ip: str, network_name: str, name: str) -> None:
    assert reservation_name(ip_address(ip), network_name) == name


def test_forms_of_range() -> None:
    cfg = load({"range": "192.168.1.5-192.168.1.25/24"})
    assert (cfg.ranges[0].cidr, window(cfg)) == ("192.168.1.0/24", ("192.168.1.5", "192.168.1.25"))
    cfg = load({"range": "192.168.2.225/28"})  # host bits dropped
    assert (cfg.ranges[0].cidr, window(cfg)) == (
        "192.168.2.224/28",
        ("192.168.2.225", "192.168.2.238"),
    )
    cfg = load({"range": "10.0.0.0/24", "range_start": "010.0.0.020", "range_end": "10.0.0.30"})
    assert window(cfg) == ("10.0.0.20", "10.0.0.30")  # leading zeros read as decimal
    cfg = load({"range": "10.0.0.0/24", "range_start": "10.0.1.9", "range_end": "bogus"})
    assert window(cfg) == ("10.0.0.1", "10.0.0.254")  # outside or unreadable: ignored
    cfg = load(
        {"range": "fd00::/126", "ipRanges": [{"range": "10.1.0.0/30", "exclude": ["10.1.0.1"]}]}
    )
    assert [r.cidr for r in cfg.ranges] == ["fd00::/126", "10.1.0.0/30"]
    assert cfg.ranges[1].exclude == ("10.1.0.1",) and cfg.overlapping


def test_small_networks_have_nothing_to_allocate() -> None:
    for cidr in ("10.0.0.0/31", "10.0.0.0/32", "fd00::/127"):
        with pytest.raises(RangeError, match="has no usable IP addresses"):
            IPRange(ip_network(cidr)).window()


def test_first_free_skips_used_and_whole_excluded_subnets() -> None:
    rng = IPRange(ip_network("10.0.0.0/24"), exclude=("10.0.0.2/31", "10.0.0.5"))
    base = int(ip_address("10.0.0.0"))
    assert rng.first_free({base + 1}) == base + 4
    assert rng.first_free({base + 1, base + 4}) == base + 6
    assert rng.allocatable() == 254 - 3
    wide = IPRange(ip_network("10.0.0.0/23"))
    assert wide.first_free(set(range(base + 1, base + 256))) == base + 256  # 10.0.1.0: no skip


def test_offsets_are_decimal_from_the_network_address() -> None:
    rng = IPRange(ip_network("10.0.0.0/16"))
    assert rng.offset(int(ip_address("10.0.1.7"))) == "263"
    assert rng.from_offset("263") == int(ip_address("10.0.1.7"))
    for unreadable in ("-1", "+3", "x", "9223372036854775808"):
        assert rng.from_offset(unreadable) is None


def test_flat_file_fills_empty_keys_but_not_overlapping(tmp_path: Path) -> None:
    flat = tmp_path / "etc/cni/net.d/whereabouts.d/whereabouts.conf"
    flat.parent.mkdir(parents=True)
    flat.write_text(
        json.dumps(
            {
                "range": "10.9.0.0/24",
                "range_start": "10.9.0.9",
                "network_name": "flat",
                "enable_overlapping_ranges": False,
                "dns": {"nameservers": ["10.9.0.53"], "domain": "flat"},
            }
        )
    )
    cfg = load({"network_name": "mine", "dns": {"domain": "mine"}}, root=str(tmp_path))
    assert window(cfg) == ("10.9.0.9", "10.9.0.254")
    assert (cfg.network_name, cfg.overlapping) == ("mine", True)
    assert (cfg.dns.domain, cfg.dns.nameservers) == ("mine", ["10.9.0.53"])
    assert load({}, root=str(tmp_path / "none")).ranges == ()  # no flat file: no error


def test_static_addresses_from_config_and_cni_args() -> None:
    cfg = load(
        {"addresses": [{"address": "10.5.0.9/24", "gateway": "10.5.0.1"}]},
        env="IgnoreUnknown=1;IP=10.6.0.7/24, fd00::7/64;GATEWAY=10.6.0.1;"
        "K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns;K8S_POD_UID=u",
    )
    assert [(str(a.address), str(a.gateway)) for a in cfg.addresses] == [
        ("10.5.0.9/24", "10.5.0.1"),
        ("10.6.0.7/24", "10.6.0.1"),
        ("fd00::7/64", "None"),
    ]
    assert cfg.podref == "ns/p"


@pytest.mark.parametrize(
    ("ipam", "env", "code", "msg"),
    [
        ({"range": "10.0.0.0/24"}, "K8S_POD_UID=u", ErrorCode.INVALID_ENV, "ARGS: unknown args"),
        (
            {"range": "10.0.0.0/24"},
            "IP=10.0.0.5",
            ErrorCode.INVALID_CONFIG,
            "invalid CIDR 10.0.0.5",
        ),
        ({"range": "x-10.0.0.9/24"}, "", ErrorCode.INVALID_CONFIG, "invalid range start IP: x"),
        ({"range": "10.0.0.1-10.0.0.9"}, "", ErrorCode.INVALID_CONFIG, "do you have the 'range'"),
        (
            {"ipRanges": [{"range": "10.0.0.0/24", "range_start": "x"}]},
            "",
            7,
            "invalid IP address: x",
        ),
        ({"addresses": [{"address": "10.0.0.1"}]}, "", 7, "invalid CIDR in addresses 10.0.0.1"),
        ({"type": "host-local"}, "", 7, "This one was: host-local"),
    ],
)
def test_bad_configs(ipam: dict[str, Any], env: str, code: int, msg: str) -> None:
    with pytest.raises(CNIError) as info:
        load(ipam, env)
    assert info.value.code == code and msg in info.value.msg


def test_legacy_versions_allow_one_static_address_per_family() -> None:
    with pytest.raises(CNIError, match="does not support more than 1 address per family"):
        load(
            {"addresses": [{"address": "10.0.0.1/24"}, {"address": "10.0.0.2/24"}]}, version="0.2.0"
        )


def test_sloppy_ip() -> None:
    assert parse_ip_sloppy("010.001.0.9") == ip_address("10.1.0.9")
    assert parse_ip_sloppy("::ffff:010.0.0.1") == ip_address("10.0.0.1")
    assert parse_ip_sloppy("256.0.0.1") is None
