"""Hot-plug (Engine.sync) on real namespaces: a running pod's annotation changes, and its
secondary networks follow, with the record, the result cache, IPAM and network-status
kept consistent. The daemon's trigger (pod informer) is tested in the cluster tier."""

from __future__ import annotations

import json
import time

import pytest

from delegates.netns import run_in_netns
from meta.config import load_meta_config
from meta.plugin import MetaPlugin
from meta.records import RecordStore
from tests.netns.conftest import Node, sh
from tests.netns.daemon import Daemon

pytestmark = pytest.mark.netns

CID = "c-hp"


def _sync(node: Node, **extra: object) -> bool:
    """One hot-plug pass for the pod's container, in the node namespace as the daemon runs."""
    conf = load_meta_config(json.dumps(node.meta(**extra)).encode())
    engine = MetaPlugin(configure_logging=False).engine_for(conf, [str(node.bin)])
    return run_in_netns(f"/run/netns/{node.name}", lambda: engine.sync(CID))


def _state(node: Node, netns: str) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """(links in the pod, (network, interface) in network-status, record's ifnames)."""
    status = [(e["name"], e["interface"]) for e in node.network_status("hp")]
    record = RecordStore(node.cni_dir).load(CID)
    assert record is not None
    return node.links(netns), status, [d.ifname for d in record.delegates]


def _events(node: Node, reason: str) -> list[str]:
    return [e["message"] for e in node.events() if e["reason"] == reason]


@pytest.fixture
def running(node: Node) -> str:
    node.nad("net-a", node.macvlan_conf("10.98.0.0/16"))
    node.nad("net-b", node.macvlan_conf("10.97.0.0/16"))
    node.pod("hp", "net-a")
    netns = node.pod_netns()
    node.ok("ADD", netns=netns, cid=CID, pod="hp")
    return netns


def test_networks_added_then_removed_follow_the_annotation(node: Node, running: str) -> None:
    netns = running
    ips_before = node.reserved_ips()

    node.pod("hp", "net-a,net-b")
    assert _sync(node) is True
    assert _state(node, netns) == (
        ["eth0", "lo", "net1", "net2"],
        [("default-net", "eth0"), ("default/net-a", "net1"), ("default/net-b", "net2")],
        ["eth0", "net1", "net2"],
    )
    assert _events(node, "AddedInterface")[-1].startswith("Add net2 [10.97.")
    assert len(node.reserved_ips()) == len(ips_before) + 1
    assert _sync(node) is False  # already in line

    # net-a goes; net-b stays where it is (net2), it is not renamed to net1
    node.pod("hp", "net-b")
    assert _sync(node) is True
    assert _state(node, netns) == (
        ["eth0", "lo", "net2"],
        [("default-net", "eth0"), ("default/net-b", "net2")],
        ["eth0", "net2"],
    )
    assert _events(node, "RemovedInterface") == ["Remove net1 from default/net-a"]
    assert not any(ip.startswith("10.98.") for ip in node.reserved_ips())

    # a new automatic name takes the lowest free netN
    node.pod("hp", "net-b,net-a")
    assert _sync(node) is True
    assert _state(node, netns)[2] == ["eth0", "net2", "net1"]

    node.ok("DEL", netns=netns, cid=CID, pod="hp")
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []
    assert RecordStore(node.cni_dir).load(CID) is None


def test_a_network_that_fails_to_attach_changes_nothing(node: Node, running: str) -> None:
    netns = running
    node.nad("broken", node.macvlan_conf("10.96.0.0/16", master="no-such-master"))
    before = _state(node, netns)
    ips = node.reserved_ips()

    node.pod("hp", "net-a,broken")
    assert _sync(node) is True  # tried; network-status rewritten as it is
    assert _state(node, netns) == before
    assert node.reserved_ips() == ips
    (failed,) = _events(node, "HotplugFailed")
    assert "default/broken" in failed and "no-such-master" in failed


def test_refusals_are_events_not_changes(node: Node, running: str) -> None:
    netns = running
    node.pod("hp", "net-a,no-such-nad")
    assert _sync(node) is False
    assert "no-such-nad" in _events(node, "HotplugFailed")[-1]
    node.pod("hp", "net-a,net-b")
    assert _sync(node) is True
    node.pod("hp", "net-b")
    assert _sync(node) is True  # net-b now on net2, alone
    # net-b would be net1 by position but keeps net2; net-a asks for net2 explicitly
    node.pod("hp", json.dumps([{"name": "net-b"}, {"name": "net-a", "interface": "net2"}]))
    assert _sync(node) is False
    assert _events(node, "HotplugFailed")[-1] == (
        "cannot hot-plug default/net-a (net2, macvlan): interface net2 is taken"
    )
    assert node.links(netns) == ["eth0", "lo", "net2"]


def test_isolation_and_the_network_limit_hold_for_hot_plug(node: Node, running: str) -> None:
    node.nad("net-x", node.macvlan_conf("10.96.0.0/16"), namespace="other")
    node.pod("hp", "net-a,other/net-x")
    assert _sync(node, namespaceIsolation=True) is False
    assert _events(node, "HotplugFailed")[-1] == (
        "pod default/hp may not use network other/net-x: namespaceIsolation allows only its "
        "own namespace and globalNamespaces (default)"
    )
    node.pod("hp", "net-a,net-b,net-b")
    assert _sync(node, maxNetworksPerPod=2) is False
    assert _events(node, "HotplugFailed")[-1] == (
        "the networks annotation of pod default/hp asks for 3 networks; at most 2 are allowed "
        "(maxNetworksPerPod)"
    )
    assert node.links(running) == ["eth0", "lo", "net1"]
    record = RecordStore(node.cni_dir).load(CID)
    assert record is not None and [d.ifname for d in record.delegates] == ["eth0", "net1"]


def test_nothing_to_sync_without_a_record_or_namespace(node: Node, running: str) -> None:
    assert _sync(node) is False  # unchanged annotation
    node.pod("hp", "net-a,net-b")
    sh("ip", "netns", "del", node.pods.pop())
    assert _sync(node) is False  # the namespace is gone: nothing to attach into
    assert RecordStore(node.cni_dir).load(CID) is not None  # DEL still has its record
    node.ok("DEL", netns=running, cid=CID, pod="hp")
    node.pod("hp", "net-a,net-b")
    assert _sync(node) is False  # no record: the pod is not running here


def test_the_daemon_hot_plugs_from_the_embedded_store(node: Node, running: str) -> None:
    daemon = Daemon(node)
    daemon.start()
    try:
        node.pod("hp", "net-a,net-b")  # rewrites the manifest; the daemon reads it every 1 s
        deadline = time.monotonic() + 15
        while len(_status(node)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _state(node, running) == (
            ["eth0", "lo", "net1", "net2"],
            [("default-net", "eth0"), ("default/net-a", "net1"), ("default/net-b", "net2")],
            ["eth0", "net1", "net2"],
        )
    finally:
        daemon.stop()


def _status(node: Node) -> list[dict[str, object]]:
    try:
        return node.network_status("hp")
    except KeyError:  # the manifest was just rewritten without one
        return []
