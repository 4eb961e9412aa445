"""In-process static IPAM: addresses, CNI_ARGS, capabilities, CHECK and DEL."""

from __future__ import annotations

from typing import Any

import pytest

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from delegates.ipam.common import CHECK_FAILED
from delegates.ipam.dispatch import ipam_add, ipam_check, ipam_del


def cmd(args: tuple[tuple[str, str], ...] = ()) -> CmdArgs:
    return CmdArgs("ADD", "c1", "/run/netns/x", "eth0", args, ("/nonexistent",), b"")


def conf(version: str = "1.1.0", top: Any = None, **ipam: Any) -> dict[str, Any]:
    out = {"cniVersion": version, "name": "s", "ipam": {"type": "static", **ipam}}
    out.update(top or {})
    return out


ADDRESSES = [
    {"address": "10.10.0.1/24", "gateway": "10.10.0.254"},
    {"address": "3ffe:ffff:0:01ff::1/64", "gateway": "3ffe:ffff:0::1"},
]


def ips(c: dict[str, Any], args: tuple[tuple[str, str], ...] = ()) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = ipam_add(c, cmd(args)).to_dict("1.0.0").get("ips", [])
    return out


def test_addresses_routes_dns() -> None:
    c = conf(
        addresses=ADDRESSES,
        routes=[{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.5.1", "mtu": 1400}],
        dns={"nameservers": ["8.8.8.8"], "domain": "example.com", "search": ["example.com"]},
    )
    assert ipam_add(c, cmd()).to_dict("1.1.0") == {
        "cniVersion": "1.1.0",
        "ips": [
            {"address": "10.10.0.1/24", "gateway": "10.10.0.254"},
            {"address": "3ffe:ffff:0:1ff::1/64", "gateway": "3ffe:ffff::1"},
        ],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.5.1", "mtu": 1400}],
        "dns": {"nameservers": ["8.8.8.8"], "domain": "example.com", "search": ["example.com"]},
    }


def test_cni_args_ip_and_gateway() -> None:
    c = conf(addresses=[{"address": "10.10.0.1/24"}])
    got = ips(c, (("IP", "10.10.0.5/24, fd00::5/64"), ("GATEWAY", "10.10.0.254,fd00::1")))
    assert got == [
        {"address": "10.10.0.1/24"},  # GATEWAY applies only to the CNI_ARGS addresses
        {"address": "10.10.0.5/24", "gateway": "10.10.0.254"},
        {"address": "fd00::5/64", "gateway": "fd00::1"},
    ]


def test_args_cni_and_runtime_config_replace_addresses() -> None:
    bogus = [{"address": "bogus"}]  # never parsed: it is replaced
    assert ips(conf(top={"args": {"cni": {"ips": ["10.0.0.7/24"]}}}, addresses=bogus)) == [
        {"address": "10.0.0.7/24"}
    ]
    both = conf(
        top={"args": {"cni": {"ips": ["10.0.0.7/24"]}}, "runtimeConfig": {"ips": ["10.0.0.8/8"]}},
        addresses=bogus,
    )
    assert ips(both) == [{"address": "10.0.0.8/8"}]


@pytest.mark.parametrize(
    ("c", "args", "message"),
    [
        (
            conf(addresses=[{"address": "10.0.0.1"}]),
            (),
            "the 'address' field is expected to be in CIDR notation, got: '10.0.0.1'",
        ),
        (conf(addresses=[{"address": "10.0.0.1/8", "gateway": "x"}]), (), "invalid IP address: x"),
        (
            conf(),
            (("IP", "10.0.0.5"),),
            "the 'ip' field is expected to be in CIDR notation, got: '10.0.0.5'",
        ),
        (conf(), (("GATEWAY", "nope"),), "invalid gateway address: nope"),
        (conf(), (("FOO", "1"),), 'ARGS: unknown args ["FOO=1"]'),
        (
            conf(top={"runtimeConfig": {"ips": ["10.0.0.8"]}}),
            (),
            "an entry in the 'ips' field is NOT in CIDR notation, got: '10.0.0.8'",
        ),
        (
            conf("0.2.0", addresses=[{"address": "10.0.0.1/8"}, {"address": "11.0.0.1/8"}]),
            (),
            "CNI version 0.2.0 does not support more than 1 address per family",
        ),
        ({"cniVersion": "1.0.0", "name": "s"}, (), "IPAM config missing 'ipam' key"),
    ],
)
def test_errors(c: dict[str, Any], args: tuple[tuple[str, str], ...], message: str) -> None:
    with pytest.raises(CNIError) as err:
        ipam_add(c, cmd(args))
    assert err.value.msg == message
    assert err.value.code in (ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_ENV)


def test_no_address_cannot_be_a_0_2_0_result() -> None:
    assert ipam_add(conf(), cmd()).ips == []
    with pytest.raises(CNIError) as err:
        ipam_add(conf("0.2.0"), cmd())
    assert err.value.code == ErrorCode.INCOMPATIBLE_VERSION


def test_del_is_a_no_op_even_for_bad_config() -> None:
    ipam_del(conf(addresses=[{"address": "bogus"}]), cmd())


def test_check() -> None:
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"}]}
    c = conf(addresses=ADDRESSES)
    with pytest.raises(CNIError, match="Required prevResult missing"):
        ipam_check(c, cmd())
    ipam_check({**c, "prevResult": prev}, cmd())  # the v6 address is simply not looked for
    wrong = conf(
        top={"prevResult": prev}, addresses=[{"address": "10.10.0.1/24", "gateway": "10.10.0.1"}]
    )
    with pytest.raises(CNIError) as err:
        ipam_check(wrong, cmd())
    assert err.value.code == CHECK_FAILED
    assert err.value.msg == "static: Failed to match addr 10.10.0.1 on interface eth0"
