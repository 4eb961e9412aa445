"""network-status entries from CNI results, and the annotation text."""

from __future__ import annotations

import json
from typing import Any

from cni.result import Result
from meta.status import NetworkStatus, network_statuses, render

DNS = {"nameservers": ["10.96.0.10"], "domain": "cluster.local", "search": ["svc"], "options": []}
DEVICE = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:3b:02.1"}}


def bridge_result() -> dict[str, Any]:
    """A bridge-plugin style result: two host-side interfaces, then the pod's."""
    return {
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "cni0", "mac": "0a:00:00:00:00:01"},
            {"name": "veth1234", "mac": "0a:00:00:00:00:02"},
            {"name": "eth0", "mac": "0a:00:00:00:00:03", "mtu": 1450, "sandbox": "/run/netns/p"},
        ],
        "ips": [
            {"address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 2},
            {"address": "fd00:0:0:0::5/64", "gateway": "fd00::1", "interface": 2},
        ],
        "routes": [
            {"dst": "0.0.0.0/0", "gw": "10.244.1.1"},
            {"dst": "10.96.0.0/12", "gw": "10.244.1.254"},
            {"dst": "::/0", "gw": "fd00::1"},
        ],
        "dns": DNS,
    }


def parsed(result: dict[str, Any]) -> Result:
    """The result as the engine holds it (read by cni.result, in 1.1.0 unless it says)."""
    return Result.from_dict({"cniVersion": "1.1.0", **result})


def as_dicts(statuses: list[NetworkStatus]) -> list[dict[str, Any]]:
    return [s.to_multus() for s in statuses]


def test_host_side_interfaces_are_skipped() -> None:
    assert as_dicts(network_statuses(parsed(bridge_result()), "cbr0", True)) == [
        {
            "name": "cbr0",
            "interface": "eth0",
            "ips": ["10.244.1.5", "fd00::5"],
            "mac": "0a:00:00:00:00:03",
            "mtu": 1450,
            "default": True,
            "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local", "search": ["svc"]},
            "gateway": ["10.244.1.1", "fd00::1"],
        }
    ]


def test_multiple_pod_interfaces_get_their_ips_by_index() -> None:
    result = {
        "interfaces": [
            {"name": "net1", "mac": "02:00:00:00:00:01", "sandbox": "/run/netns/p"},
            {"name": "host0"},
            {"name": "net2", "mac": "02:00:00:00:00:02", "sandbox": "/run/netns/p"},
        ],
        "ips": [
            {"address": "10.1.0.2/24", "interface": 2},
            {"address": "10.2.0.2/24", "interface": 0},
            {"address": "10.3.0.2/24", "interface": 1},  # host side: dropped
            {"address": "10.4.0.2/24", "interface": 7},  # no such interface: dropped
            {"address": "10.5.0.2/24"},  # no index: the last pod interface
        ],
    }
    statuses = network_statuses(parsed(result), "ns/multi", False, DEVICE)
    assert [(s.interface, s.ips, s.default) for s in statuses] == [
        ("net1", ["10.2.0.2"], False),
        ("net2", ["10.1.0.2", "10.5.0.2"], False),
    ]
    assert all(s.device_info == DEVICE and s.gateway is None and s.dns == {} for s in statuses)


def test_default_goes_to_the_interface_with_the_first_gateway() -> None:
    result = {
        "interfaces": [
            {"name": "a", "sandbox": "x"},
            {"name": "b", "sandbox": "x"},
        ],
        "ips": [
            {"address": "10.1.0.2/24", "interface": 0},
            {"address": "10.2.0.2/24", "gateway": "10.2.0.1", "interface": 1},
        ],
    }
    assert [s.default for s in network_statuses(parsed(result), "n", True)] == [False, True]
    assert [s.default for s in network_statuses(parsed(result), "n", False)] == [False, False]


def test_default_without_gateway_is_the_first_pod_interface() -> None:
    result = {
        "interfaces": [{"name": "h"}, {"name": "a", "sandbox": "x"}, {"name": "b", "sandbox": "x"}]
    }
    assert [(s.interface, s.default) for s in network_statuses(parsed(result), "n", True)] == [
        ("a", True),
        ("b", False),
    ]


def test_single_interface_takes_every_ip_whatever_its_index() -> None:
    result = {
        "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01", "sandbox": "/run/netns/p"}],
        "ips": [
            {"address": "10.1.0.2/24", "interface": 0},
            {"address": "10.1.0.3/24", "interface": 5},
            {"address": "10.1.0.4/24"},
        ],
        "routes": [{"dst": "10.0.0.0/8", "gw": "10.1.0.1"}],
    }
    (status,) = network_statuses(parsed(result), "ns/net", False, DEVICE)
    assert status.to_multus() == {
        "name": "ns/net",
        "interface": "net1",
        "ips": ["10.1.0.2", "10.1.0.3", "10.1.0.4"],
        "mac": "02:00:00:00:00:01",
        "dns": {},
        "device-info": DEVICE,
    }


def test_single_host_side_interface_gives_an_entry_without_interface() -> None:
    result = {
        "interfaces": [{"name": "host0", "mac": "02:00:00:00:00:01"}],
        "ips": [{"address": "10.1.0.2/24", "interface": 0}],
    }
    assert as_dicts(network_statuses(parsed(result), "n", True)) == [
        {"name": "n", "ips": ["10.1.0.2"], "default": True, "dns": {}}
    ]


def test_no_pod_interface_gives_no_entry() -> None:
    result = {"ips": [{"address": "10.1.0.2/24"}]}
    assert network_statuses(parsed(result), "n", True) == []
    result["interfaces"] = [{"name": "h1"}, {"name": "h2"}]
    assert network_statuses(parsed(result), "n", True) == []


def test_nulls_are_absent() -> None:
    result = {
        "interfaces": [{"name": "eth0", "mac": None, "mtu": None, "sandbox": "x"}],
        "ips": [{"address": "10.1.0.2/24", "gateway": None, "interface": None}],
        "routes": None,
        "dns": {"nameservers": None, "domain": None},
    }
    assert as_dicts(network_statuses(parsed(result), "n", False)) == [
        {"name": "n", "interface": "eth0", "ips": ["10.1.0.2"], "dns": {}}
    ]


def test_default_route_without_gateway_is_not_listed() -> None:
    result = {
        "interfaces": [{"name": "eth0", "sandbox": "x"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "FD00:0::1"}],
    }
    (status,) = network_statuses(parsed(result), "n", False)
    assert status.gateway == ["fd00::1"]


# ---- render -------------------------------------------------------------------------


def test_render_matches_multus_layout() -> None:
    statuses = network_statuses(parsed(bridge_result()), "cbr0", True)
    statuses += network_statuses(
        parsed(
            {"interfaces": [{"name": "net1", "sandbox": "x"}], "ips": [{"address": "10.9.0.2/24"}]}
        ),
        "ns/sriov",
        False,
        DEVICE,
    )
    assert render(statuses) == (
        "[{\n"
        '    "name": "cbr0",\n'
        '    "interface": "eth0",\n'
        '    "ips": [\n'
        '        "10.244.1.5",\n'
        '        "fd00::5"\n'
        "    ],\n"
        '    "mac": "0a:00:00:00:00:03",\n'
        '    "mtu": 1450,\n'
        '    "default": true,\n'
        '    "dns": {\n'
        '        "nameservers": [\n'
        '            "10.96.0.10"\n'
        "        ],\n"
        '        "domain": "cluster.local",\n'
        '        "search": [\n'
        '            "svc"\n'
        "        ]\n"
        "    },\n"
        '    "gateway": [\n'
        '        "10.244.1.1",\n'
        '        "fd00::1"\n'
        "    ]\n"
        "},{\n"
        '    "name": "ns/sriov",\n'
        '    "interface": "net1",\n'
        '    "ips": [\n'
        '        "10.9.0.2"\n'
        "    ],\n"
        '    "dns": {},\n'
        '    "device-info": {\n'
        '        "type": "pci",\n'
        '        "version": "1.1.0",\n'
        '        "pci": {\n'
        '            "pci-address": "0000:3b:02.1"\n'
        "        }\n"
        "    }\n"
        "}]"
    )
    decoded = json.loads(render(statuses))
    assert [entry["name"] for entry in decoded] == ["cbr0", "ns/sriov"]


def test_render_empty_and_minimal() -> None:
    assert render([]) == "[]"
    assert render([NetworkStatus(name="n")]) == '[{\n    "name": "n",\n    "dns": {}\n}]'


def test_render_escapes_like_go() -> None:
    text = render([NetworkStatus(name="a<b>&c\u2028é")])
    assert '"a\\u003cb\\u003e\\u0026c\\u2028é"' in text
    assert json.loads(text)[0]["name"] == "a<b>&c\u2028é"


def test_model_accepts_multus_field_names() -> None:
    status = NetworkStatus.model_validate({"name": "n", "device-info": DEVICE, "mtu": 9000})
    assert status.device_info == DEVICE
    assert status.to_multus() == {"name": "n", "mtu": 9000, "dns": {}, "device-info": DEVICE}
