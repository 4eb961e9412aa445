"""Go-compatible parsing helpers and config decoding shared by the IPAMs."""

from __future__ import annotations

from ipaddress import ip_address, ip_interface

import pytest
from pydantic import Field

from cni.errors import CNIError, ErrorCode
from delegates.ipam.common import (
    ConfModel,
    RouteConf,
    load_env_args,
    parse_cidr,
    parse_conf,
    parse_ip,
    parse_ip_or_cidr,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("fd00::1", "fd00::1"),
        ("::ffff:10.1.2.3", "10.1.2.3"),  # IPv4-mapped is IPv4, as in Go
        ("fe80::1%eth0", None),
        ("010.1.2.3", None),
        ("10.1.2.3/24", None),
        ("", None),
        (" 10.1.2.3", None),
    ],
)
def test_parse_ip(text: str, expected: str | None) -> None:
    got = parse_ip(text)
    assert (str(got) if got is not None else None) == expected


def test_parse_cidr_keeps_host_bits() -> None:
    got = parse_cidr("10.1.2.3/24")
    assert got == ip_interface("10.1.2.3/24")
    assert got is not None and str(got.network) == "10.1.2.0/24"
    for bad in ("10.1.2.3", "10.1.2.3/33", "10.1.2.3/255.255.255.0", "x/24", "fd00::/-1"):
        assert parse_cidr(bad) is None


def test_parse_ip_or_cidr() -> None:
    assert parse_ip_or_cidr("10.1.2.3/24") == ip_address("10.1.2.3")
    assert parse_ip_or_cidr("fd00::7") == ip_address("fd00::7")
    assert parse_ip_or_cidr("") is None
    with pytest.raises(ValueError, match="invalid IP address nope"):
        parse_ip_or_cidr("nope")


def test_load_env_args_known_unknown_and_ignore() -> None:
    fields = {"IP": parse_ip_or_cidr}
    assert load_env_args([("IP", "10.0.0.1")], fields) == {"IP": ip_address("10.0.0.1")}
    assert load_env_args([("IP", "10.0.0.1"), ("IP", "10.0.0.2")], fields)["IP"] == ip_address(
        "10.0.0.2"
    )
    pairs = [("IgnoreUnknown", "TRUE"), ("K8S_POD_NAME", "p")]
    assert load_env_args(pairs, fields) == {}
    with pytest.raises(CNIError) as err:
        load_env_args([("K8S_POD_NAME", "p"), ("ip", "1")], fields)
    assert err.value.code == ErrorCode.INVALID_ENV
    assert err.value.msg == 'ARGS: unknown args ["K8S_POD_NAME=p" "ip=1"]'
    with pytest.raises(CNIError, match='invalid pair "a=b=c"'):
        load_env_args([("a", "b=c")], fields)
    with pytest.raises(CNIError, match="boolean unmarshal error: invalid input maybe"):
        load_env_args([("IgnoreUnknown", "maybe")], fields)
    with pytest.raises(CNIError, match=r'pair "IP=x": invalid IP address x'):
        load_env_args([("IP", "x")], fields)


class _Sample(ConfModel):
    route: RouteConf | None = None
    names: list[str] = Field(default_factory=list)


def test_conf_model_matches_keys_case_insensitively_and_drops_null() -> None:
    got = _Sample.model_validate({"ROUTE": {"Dst": "10.0.0.0/8", "GW": "10.0.0.1"}, "names": None})
    assert got.route is not None and str(got.route.to_route().dst) == "10.0.0.0/8"
    assert got.names == []


def test_parse_conf_error_names_field_and_keeps_go_message() -> None:
    with pytest.raises(CNIError) as err:
        parse_conf(_Sample, {"route": {"dst": "bogus"}})
    assert err.value.code == ErrorCode.INVALID_CONFIG
    assert err.value.msg == "invalid CIDR address: bogus"
    assert err.value.details == "field route.dst"
    with pytest.raises(CNIError) as err:
        parse_conf(_Sample, {"names": "x"})
    assert err.value.details == "field names"
