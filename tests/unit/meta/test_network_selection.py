"""The k8s.v1.cni.cncf.io/networks annotation parser."""

from __future__ import annotations

import json
import sys

import pytest

from cni.errors import CNIError, ErrorCode
from meta.selection import (
    NetworkSelection,
    parse_network_ref,
    parse_networks,
)


def refs(value: str) -> list[tuple[str, str | None]]:
    return [(s.ref, s.interface) for s in parse_networks(value, "pods")]


def invalid(value: str) -> str:
    with pytest.raises(CNIError) as caught:
        parse_networks(value, "pods")
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    return caught.value.msg


# ---- comma form ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("macvlan", [("pods/macvlan", None)]),
        ("other/macvlan", [("other/macvlan", None)]),
        ("macvlan@eth1", [("pods/macvlan", "eth1")]),
        ("other/macvlan@eth1", [("other/macvlan", "eth1")]),
        (
            " a , other/b@net5,c ",
            [("pods/a", None), ("other/b", "net5"), ("pods/c", None)],
        ),
        ("kube-system / x @ eth3", [("kube-system/x", "eth3")]),
        ("a,a", [("pods/a", None), ("pods/a", None)]),
        ("a,,b,", [("pods/a", None), ("pods/b", None)]),
        ("/a", [("pods/a", None)]),  # empty namespace: the pod's, as Multus
        ("a@", [("pods/a", None)]),  # empty interface: not requested, as Multus
        ("", []),
        (" , ", []),
        ("n" * 63, [(f"pods/{'n' * 63}", None)]),
    ],
)
def test_comma_form(value: str, expected: list[tuple[str, str | None]]) -> None:
    assert refs(value) == expected


def test_comma_form_leaves_other_fields_unset() -> None:
    (selection,) = parse_networks("ns/net@eth1", "pods")
    assert selection.name == "net"
    assert selection.namespace == "ns"
    assert selection.model_dump(exclude_none=True) == {
        "name": "net",
        "namespace": "ns",
        "interface": "eth1",
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("foo/Bar", 'element 1 ("foo/Bar"): name "Bar" is not a valid DNS-1123 label'),
        ("ok, Foo/bar", 'element 2 ("Foo/bar"): namespace "Foo" is not a valid DNS-1123 label'),
        ("a.b", 'name "a.b" is not a valid DNS-1123 label'),
        ("-a", 'name "-a" is not a valid DNS-1123 label'),
        ("a-", 'name "a-" is not a valid DNS-1123 label'),
        ("a_b", 'name "a_b" is not a valid DNS-1123 label'),
        ("n" * 64, "is not a valid DNS-1123 label"),
        ("a/b/c", 'element 1 ("a/b/c"): more than one "/"'),
        ("a@b@c", 'element 1 ("a@b@c"): more than one "@"'),
        ("@eth0", "name is empty"),
        ("ns/", "name is empty"),
        ("a@eth0123456789abc", 'interface name "eth0123456789abc" is longer than 15 bytes'),
        ("a@e:1", 'interface name "e:1" must not contain "/", ":" or whitespace'),
        ("a@..", 'interface name ".." is not allowed'),
        ("a@eth1, b@eth1", 'element 2 ("b@eth1"): interface "eth1" is also requested by element 1'),
    ],
)
def test_comma_form_errors(value: str, message: str) -> None:
    assert message in invalid(value)


def test_error_names_position_among_skipped_blanks() -> None:
    assert invalid("a,,Bad").startswith('networks annotation element 3 ("Bad"):')


# ---- JSON form ----------------------------------------------------------------------

FULL = {
    "name": "sriov-net",
    "namespace": "net-ns",
    "interface": "vf0",
    "ips": ["10.1.1.5/24", "fd00::5/64", "10.1.2.5", "fd00:1::5"],
    "mac": "02:00:00:00:00:01",
    "infiniband-guid": "c2:11:22:33:44:55:66:77",
    "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
    "bandwidth": {"ingressRate": 1000, "ingressBurst": 10, "egressRate": 2000, "egressBurst": 20},
    "cni-args": {"foo": "bar", "n": 1},
    "default-route": ["10.1.1.1", "fd00::1"],
    "deviceID": "0000:3b:02.1",
}


def test_json_form_with_every_field() -> None:
    (selection,) = parse_networks(json.dumps([FULL]), "pods")
    assert selection.ref == "net-ns/sriov-net"
    assert selection.interface == "vf0"
    assert selection.ips == FULL["ips"]
    assert selection.mac == "02:00:00:00:00:01"
    assert selection.infiniband_guid == "c2:11:22:33:44:55:66:77"
    assert selection.port_mappings == FULL["portMappings"]
    assert selection.bandwidth == FULL["bandwidth"]
    assert selection.cni_args == {"foo": "bar", "n": 1}
    assert selection.default_route == ["10.1.1.1", "fd00::1"]
    assert selection.device_id == "0000:3b:02.1"
    # every field but the claim reference, which may not come with `ips`
    assert selection.model_dump(by_alias=True) == {**FULL, "ipam-claim-reference": None}


def test_json_form_defaults() -> None:
    value = '[{"name": "a"}, {"name": "b", "namespace": ""}, {"name": "c", "namespace": null}]'
    selections = parse_networks(value, "pods")
    assert [s.ref for s in selections] == ["pods/a", "pods/b", "pods/c"]
    assert selections[0].model_dump(exclude={"name", "namespace"}) == dict.fromkeys(
        NetworkSelection.model_fields.keys() - {"name", "namespace"}
    )


def test_json_form_legacy_interface_request() -> None:
    value = '[{"name": "a", "interfaceRequest": "eth7"}, {"name": "b", "interface": "eth8"}]'
    assert refs(value) == [("pods/a", "eth7"), ("pods/b", "eth8")]


def test_json_form_interface_wins_over_legacy_alias() -> None:
    value = '[{"name": "a", "interface": "net1", "interfaceRequest": "net9"}]'
    assert refs(value) == [("pods/a", "net1")]


def test_json_form_empty_strings_mean_not_requested() -> None:
    value = '[{"name": "a", "interface": "", "mac": "", "deviceID": "", "infiniband-guid": ""}]'
    (selection,) = parse_networks(value, "pods")
    assert selection.interface is None
    assert selection.mac is None
    assert selection.device_id is None
    assert selection.infiniband_guid is None


def test_json_form_accepts_dotted_nad_names_and_ignores_unknown_fields() -> None:
    value = '[{"name": "net.v2", "unknown": 1}]'
    assert refs(value) == [("pods/net.v2", None)]


def test_json_form_empty_list() -> None:
    assert parse_networks(" [ ] ", "pods") == []


@pytest.mark.parametrize(
    "mac",
    [
        "02:00:00:00:00:01",
        "02-00-00-00-00-0A",
        "0200.0000.0001",
        "02:00:00:00:00:00:00:01",
        ":".join(["aa"] * 20),
    ],
)
def test_valid_hardware_addresses(mac: str) -> None:
    (selection,) = parse_networks(json.dumps([{"name": "a", "mac": mac}]), "pods")
    assert selection.mac == mac


@pytest.mark.parametrize(
    ("element", "message"),
    [
        ({"namespace": "x"}, "name: Field required"),
        ({"name": 5}, "name: Input should be a valid string"),
        ({"name": "Bad"}, 'name "Bad" is not a valid DNS-1123 subdomain'),
        ({"name": "a", "namespace": "a.b"}, 'namespace "a.b" is not a valid DNS-1123 label'),
        ({"name": "a", "interface": "x" * 16}, "is longer than 15 bytes"),
        ({"name": "a", "interface": "a/b"}, 'must not contain "/", ":" or whitespace'),
        ({"name": "a", "interface": "a b"}, 'must not contain "/", ":" or whitespace'),
        ({"name": "a", "interfaceRequest": "a:b"}, 'must not contain "/", ":" or whitespace'),
        ({"name": "a", "ips": ["10.1.1.300"]}, 'ips: "10.1.1.300" is not an IP address or CIDR'),
        ({"name": "a", "ips": ["10.1.1.1/33"]}, 'ips: "10.1.1.1/33" is not an IP address or CIDR'),
        ({"name": "a", "ips": ["10.1.1.1/"]}, 'ips: "10.1.1.1/" is not an IP address or CIDR'),
        ({"name": "a", "ips": ["fe80::1%eth0"]}, 'ips: "fe80::1%eth0" is not an IP address'),
        ({"name": "a", "ips": "10.1.1.1"}, "ips: Input should be a valid list"),
        ({"name": "a", "ips": [1]}, "ips[0]: Input should be a valid string"),
        ({"name": "a", "mac": "02:00:00:00:00"}, 'mac "02:00:00:00:00" is not a valid hardware'),
        ({"name": "a", "mac": "02:00-00:00:00:01"}, "is not a valid hardware address"),
        ({"name": "a", "mac": "zz:00:00:00:00:01"}, "is not a valid hardware address"),
        ({"name": "a", "infiniband-guid": "x"}, 'infiniband-guid "x" is not a valid hardware'),
        ({"name": "a", "mac": "01:00:5e:00:00:01"}, 'mac "01:00:5e:00:00:01" is a multicast'),
        ({"name": "a", "mac": "03:00:00:00:00:00:00:01"}, "is a multicast address"),
        ({"name": "a", "mac": "00:00:00:00:00:00"}, 'mac "00:00:00:00:00:00" is all zeros'),
        ({"name": "a", "mac": "FF-FF-FF-FF-FF-FF"}, 'mac "FF-FF-FF-FF-FF-FF" is the broadcast'),
        ({"name": "a", "interface": "all"}, 'interface name "all" is not allowed'),
        ({"name": "a", "interface": "default"}, 'interface name "default" is not allowed'),
        ({"name": "a", "default-route": ["10.1.1.1/24"]}, 'default-route: "10.1.1.1/24"'),
        ({"name": "a", "default-route": ["gw"]}, 'default-route: "gw" is not an IP address'),
        ({"name": "a", "cni-args": ["x"]}, "cni-args: Input should be a valid dictionary"),
        ({"name": "a", "portMappings": {"hostPort": 1}}, "portMappings: Input should be a valid"),
        ({"name": "a", "bandwidth": 5}, "bandwidth: Input should be a valid dictionary"),
    ],
)
def test_json_form_errors(element: dict[str, object], message: str) -> None:
    msg = invalid(json.dumps([{"name": "ok"}, element]))
    assert msg.startswith("networks annotation element 2 (")
    assert message in msg


def test_json_error_names_the_element() -> None:
    value = '[{"name": "good"}, {"name": "b", "namespace": "ns", "mac": "x"}]'
    assert invalid(value) == (
        'networks annotation element 2 ("ns/b"): mac "x" is not a valid hardware address'
    )


def test_json_duplicate_interfaces() -> None:
    value = '[{"name": "a", "interface": "net1"}, {"name": "b", "interfaceRequest": "net1"}]'
    assert invalid(value) == (
        'networks annotation element 2 ("b"): interface "net1" is also requested by element 1'
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"name": "a"}', "expected a JSON list of objects, got object"),
        ('"a"', "expected a JSON list of objects, got string"),
        ('["a"]', 'element 1 ("a"): expected a JSON object, got string'),
        ('[{"name": "a"}, null]', "element 2 (null): expected a JSON object, got null"),
        ('[{"name": "a"}, [1]]', "expected a JSON object, got list"),
    ],
)
def test_json_shape_errors(value: str, message: str) -> None:
    assert message in invalid(value)


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ('[{"name": "a"}', "line 1 column 15"),
        ('[{"name": a}]', "line 1 column 11"),
        # 3.13's json names a trailing comma itself, one column earlier
        ('[\n  {"name": "a",}\n]', f"line 2 column {15 if sys.version_info >= (3, 13) else 16}"),
    ],
)
def test_bad_json_is_a_decode_failure(value: str, where: str) -> None:
    with pytest.raises(CNIError) as caught:
        parse_networks(value, "pods")
    assert caught.value.code == ErrorCode.DECODE_FAILURE
    assert caught.value.msg.startswith("networks annotation: invalid JSON at " + where)


# ---- references and interface names -------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("macvlan", ("kube-system", "macvlan")),
        (" other/macvlan ", ("other", "macvlan")),
        ("k8s-pod-network", ("kube-system", "k8s-pod-network")),
        ("my_net.conf", ("kube-system", "my_net.conf")),  # a CNI config name
        ("ns/Cbr0", ("ns", "Cbr0")),
    ],
)
def test_parse_network_ref(value: str, expected: tuple[str, str]) -> None:
    assert parse_network_ref(value, "kube-system") == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", 'network reference "": name "" is not a valid network name'),
        ("/a", 'network reference "/a": empty namespace'),
        ("a/b/c", 'network reference "a/b/c": more than one "/"'),
        ("NS/a", 'namespace "NS" is not a valid DNS-1123 label'),
        ("ns/a b", 'name "a b" is not a valid network name'),
        ("ns/-a", 'name "-a" is not a valid network name'),
    ],
)
def test_parse_network_ref_errors(value: str, message: str) -> None:
    with pytest.raises(CNIError) as caught:
        parse_network_ref(value, "kube-system")
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert message in caught.value.msg
