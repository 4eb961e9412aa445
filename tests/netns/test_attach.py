"""ADD and DEL through the installed binary, reference plugins as delegates."""

from __future__ import annotations

import json

import pytest

from tests.netns.conftest import Node, sh


def test_default_and_macvlan_attach_report_and_detach(node: Node) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("web", "macvlan-net")
    netns = node.pod_netns()

    result = node.ok("ADD", netns=netns, cid="c-web", pod="web")

    assert result is not None and result["cniVersion"] == "1.1.0"
    assert [i["name"] for i in result["interfaces"] if i.get("sandbox")] == ["eth0"]
    assert node.links(netns) == ["eth0", "lo", "net1"]
    status = node.network_status("web")
    assert [(s["name"], s["interface"], s.get("default", False)) for s in status] == [
        ("default-net", "eth0", True),
        ("default/macvlan-net", "net1", False),
    ]
    assert status[0]["ips"] == node.addresses(netns, "eth0")
    assert status[1]["ips"] == node.addresses(netns, "net1")
    reasons = [(e["reason"], e["message"].split(" ")[1]) for e in node.events()]
    assert reasons == [("AddedInterface", "eth0"), ("AddedInterface", "net1")]
    assert len(node.reserved_ips()) == 2

    node.ok("DEL", netns=netns, cid="c-web", pod="web")

    assert node.links(netns) == ["lo"]
    assert node.reserved_ips() == []


def test_json_form_static_ip_mac_and_interface_name(node: Node) -> None:
    static = node.macvlan_conf(capabilities={"ips": True, "mac": True})
    static["ipam"] = {"type": "static"}
    node.nad("static-net", static)
    node.pod(
        "db",
        [
            {
                "name": "static-net",
                "interface": "data0",
                "ips": ["10.98.7.7/16"],
                "mac": "02:00:00:00:77:07",
            }
        ],
    )
    netns = node.pod_netns()

    node.ok("ADD", netns=netns, cid="c-db", pod="db")

    assert node.addresses(netns, "data0") == ["10.98.7.7"]
    entry = node.network_status("db")[1]
    assert (entry["interface"], entry["ips"], entry["mac"]) == (
        "data0",
        ["10.98.7.7"],
        "02:00:00:00:77:07",
    )


def test_two_pods_reach_each_other_on_both_networks(node: Node) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    ips = {}
    for pod in ("a", "b"):
        node.pod(pod, "macvlan-net")
        netns = node.pod_netns()
        node.ok("ADD", netns=netns, cid=f"c-{pod}", pod=pod)
        ips[pod] = {s["interface"]: s["ips"][0] for s in node.network_status(pod)}
    for ifname in ("eth0", "net1"):
        done = sh("ping", "-c", "1", "-W", "2", ips["b"][ifname], netns=node.pods[0], check=False)
        assert done.returncode == 0, done.stdout


def test_pod_missing_from_store_gets_an_empty_result(node: Node) -> None:
    netns = node.pod_netns()
    result = node.ok("ADD", netns=netns, cid="c-ghost", pod="ghost")
    assert result is not None and not result.get("interfaces")
    assert node.links(netns) == ["lo"]


def test_missing_nad_fails_add_with_event_and_leaves_nothing(node: Node) -> None:
    node.pod("lost", "no-such-net")
    netns = node.pod_netns()

    error = node.error("ADD", netns=netns, cid="c-lost", pod="lost")

    assert error["code"] == 7 and "default/no-such-net" in error["msg"]
    assert [e["reason"] for e in node.events()] == ["NoNetworkFound"]
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def test_uid_mismatch_is_refused(node: Node) -> None:
    node.pod("reused")
    error = node.error("ADD", netns=node.pod_netns(), cid="c-old", pod="reused", uid="uid-older")
    assert error["code"] == 3 and "older pod" in error["msg"]


def test_namespace_isolation(node: Node) -> None:
    node.nad("shared", node.macvlan_conf(), namespace="infra")
    node.pod("iso", "infra/shared", namespace="apps")

    error = node.error(
        "ADD",
        netns=node.pod_netns(),
        cid="c-iso1",
        pod="iso",
        namespace="apps",
        conf=node.meta(namespaceIsolation=True),
    )
    assert "namespaceIsolation" in error["msg"]

    netns = node.pod_netns()
    node.ok(
        "ADD",
        netns=netns,
        cid="c-iso2",
        pod="iso",
        namespace="apps",
        conf=node.meta(namespaceIsolation=True, globalNamespaces="infra"),
    )
    assert node.links(netns) == ["eth0", "lo", "net1"]


def test_default_route_moves_to_the_requested_network(node: Node) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("gw", [{"name": "macvlan-net", "default-route": ["10.98.0.1"]}])
    netns = node.pod_netns()

    node.ok("ADD", netns=netns, cid="c-gw", pod="gw")

    routes = json.loads(sh("ip", "-j", "route", "show", "default", netns=node.pods[0]).stdout)
    assert [(r["gateway"], r["dev"]) for r in routes] == [("10.98.0.1", "net1")]
    status = node.network_status("gw")
    assert status[1]["gateway"] == ["10.98.0.1"] and "gateway" not in status[0]
    node.ok("CHECK", netns=netns, cid="c-gw", pod="gw")


def test_two_default_routes_for_one_family_is_an_error(node: Node) -> None:
    node.nad("m1", node.macvlan_conf())
    node.nad("m2", node.macvlan_conf("10.97.0.0/16"))
    node.pod(
        "ecmp",
        [
            {"name": "m1", "default-route": ["10.98.0.1"]},
            {"name": "m2", "default-route": ["10.97.0.1"]},
        ],
    )
    netns = node.pod_netns()
    error = node.error("ADD", netns=netns, cid="c-ecmp", pod="ecmp")
    assert error["code"] == 7 and "more than one IPv4 gateway" in error["msg"]
    assert node.links(netns) == ["lo"]


@pytest.mark.parametrize(
    "exec_delegates", [[], ["macvlan", "static"]], ids=["builtin", "reference"]
)
def test_ips_and_mac_without_the_capabilities_arrive_in_cni_args(
    node: Node, exec_delegates: list[str]
) -> None:
    """As with Multus 4.2 (IP= and MAC= in CNI_ARGS): static IPAM and macvlan honour a pod's
    ips and mac although the NAD declares no capability, ours as the reference plugins."""
    node.nad("plain-static", node.macvlan_conf(ipam={"type": "static"}))
    node.pod(
        "nocap",
        [{"name": "plain-static", "ips": ["10.98.7.8/16"], "mac": "02:00:00:00:77:08"}],
    )
    netns = node.pod_netns()

    node.ok(
        "ADD", netns=netns, cid="c-nocap", pod="nocap", conf=node.meta(execDelegates=exec_delegates)
    )

    assert node.addresses(netns, "net1") == ["10.98.7.8"]
    entry = node.network_status("nocap")[1]
    assert (entry["ips"], entry["mac"]) == (["10.98.7.8"], "02:00:00:00:77:08")
    assert [e["reason"] for e in node.events()] == ["AddedInterface", "AddedInterface"]


def test_ips_no_plugin_honours_are_a_warning_event(node: Node) -> None:
    l2_only = node.macvlan_conf()
    del l2_only["ipam"]
    node.nad("l2", l2_only)
    node.pod("l2pod", [{"name": "l2", "ips": ["10.98.7.9/16"]}])
    netns = node.pod_netns()

    node.ok("ADD", netns=netns, cid="c-l2", pod="l2pod")

    warnings = [e for e in node.events() if e["reason"] == "IgnoredRequest"]
    assert [(e["type"], e["message"]) for e in warnings] == [
        (
            "Warning",
            "network default/l2 (net1): the pod asked for ips 10.98.7.9 (got none); no plugin "
            "of the network honoured it, in runtimeConfig or in CNI_ARGS",
        )
    ]
    log = (node.root / "plexus.log").read_text()
    assert "request not honoured" in log


def test_a_default_network_from_a_nad_is_named_namespace_slash_name(node: Node) -> None:
    """Multus names it `<namespace>/<nad>` in network-status and events, not by its config."""
    node.nad("alt", node.bridge_conf(name="inner-name"), namespace="kube-system")
    node.pod("alt", **{"v1.multus-cni.io/default-network": "alt"})
    netns = node.pod_netns()

    node.ok("ADD", netns=netns, cid="c-alt", pod="alt")

    status = node.network_status("alt")
    assert [(s["name"], s["interface"], s.get("default")) for s in status] == [
        ("kube-system/alt", "eth0", True)
    ]
    assert [e["message"].split(" from ")[1] for e in node.events()] == ["kube-system/alt"]
