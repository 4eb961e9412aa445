"""End to end through a real kubelet: the production shape of a Plexus node.

kube-apiserver -> kubelet -> containerd CRI -> `plexus` shim -> `plexus daemon` (Kubernetes
source, informers) -> reference bridge (default network) + a macvlan NAD, with the
network-status written on the pod in the API; and the Plexus device plugin registering
with the same kubelet, whose PodResources API then tells the daemon which VF a pod got.
The node is tests/cluster/kubelet.py's `KubeletNode`; the SR-IOV side is a FAKE sysfs
(the host has no SR-IOV), everything else is real.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.apiserver import Cluster
from tests.cluster.kubelet import (
    DevicePlugin,
    KubeletNode,
    create_nad,
    network_status,
)
from tests.runtime.conftest import addresses, in_netns

DEFAULT_SUBNET = "10.99.0.0/16"  # Node.bridge_conf(), the node's primary network
MACVLAN_SUBNET = "10.98.0.0/16"
VF_SUBNET = "10.97.0.0/16"
PF = "0000:3b:00.0"
VFS = ["0000:3b:02.0", "0000:3b:02.1"]
RESOURCE_NAME = "uplink_vfs"
RESOURCE = f"intel.com/{RESOURCE_NAME}"
RESOURCE_ENV = "PCIDEVICE_INTEL_COM_UPLINK_VFS"


def events(cluster: Cluster, namespace: str, uid: str, reason: str) -> list[str]:
    items = cluster.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [
        e["message"]
        for e in items
        if e["involvedObject"].get("uid") == uid and e["reason"] == reason
    ]


def check_gone(kn: KubeletNode, uid: str, sandbox_id: str, netns: str, ips: list[str]) -> None:
    """After the pod is deleted: its sandbox stopped, its netns and links gone, its IPs
    released and Plexus's record of it gone. (Removing the stopped sandbox is the kubelet's
    container GC, once a minute: the fixture's teardown removes it.)"""
    assert kn.sandboxes(uid, ready_only=True) == []
    assert not Path(netns).exists(), f"{netns} still exists"
    assert sandbox_id not in kn.records()
    assert not set(ips) & set(kn.node.reserved_ips())
    assert not kn.libcni_result(sandbox_id).exists()  # containerd's own cache of the ADD


def node_veths(kn: KubeletNode) -> list[str]:
    """Host ends of pod veths on the node (the bridge plugin names them veth*)."""
    return [n for n in kn.node.links(f"/run/netns/{kn.node.name}") if n.startswith("veth")]


def test_pod_gets_bridge_and_macvlan_through_the_kubelet(
    kubelet_node: KubeletNode, namespace: str
) -> None:
    kn = kubelet_node
    create_nad(kn.cluster, namespace, "macvlan-net", kn.node.macvlan_conf(MACVLAN_SUBNET))
    records_before, reserved_before = kn.records(), kn.node.reserved_ips()
    assert kn.daemon is not None
    adds_before = kn.daemon.metric("plexus_requests_total", verb="ADD", result="ok")

    pod = kn.run_pod(namespace, kn.pod_manifest("web", "macvlan-net"))
    uid = pod["metadata"]["uid"]
    entries = network_status(kn, namespace, "web")

    # The kernel state of the pod's sandbox, which the kubelet created through CRI.
    (sandbox,) = kn.sandboxes(uid, ready_only=True)
    netns = kn.sandbox_netns(sandbox.id)
    links = addresses(netns)
    assert sorted(links) == ["eth0", "lo", "net1"]
    assert [(e["name"], e["interface"], e["ips"], e["mac"]) for e in entries] == [
        ("default-net", "eth0", links["eth0"]["ips"], links["eth0"]["mac"]),
        (f"{namespace}/macvlan-net", "net1", links["net1"]["ips"], links["net1"]["mac"]),
    ]
    assert entries[0].get("default") is True and not entries[1].get("default")
    (eth0_ip,), (net1_ip,) = links["eth0"]["ips"], links["net1"]["ips"]
    assert ipaddress.ip_address(eth0_ip) in ipaddress.ip_network(DEFAULT_SUBNET)
    assert ipaddress.ip_address(net1_ip) in ipaddress.ip_network(MACVLAN_SUBNET)
    routes = json.loads(in_netns(netns, "ip", "-j", "route", "show", "default"))
    assert [r["dev"] for r in routes] == ["eth0"], routes
    # The kubelet got the pod IP from CRI, which got it from Plexus's result.
    now = kn.get_pod(namespace, "web")
    assert now is not None and now["status"]["podIP"] == eth0_ip
    (container,) = kn.containers(sandbox.id)
    assert container.metadata.name == "app"

    kn.wait_for(
        "AddedInterface events",
        lambda: len(events(kn.cluster, namespace, uid, "AddedInterface")) == 2,
    )  # written in the background
    added = events(kn.cluster, namespace, uid, "AddedInterface")
    assert sorted(added) == sorted(
        [
            f"Add eth0 [{eth0_ip}/16] from default-net",
            f"Add net1 [{net1_ip}/16] from {namespace}/macvlan-net",
        ]
    ), added
    assert sandbox.id in kn.records()
    assert kn.libcni_result(sandbox.id).exists()
    # containerd ran the `plexus` shim, which forwarded the ADD to the daemon.
    assert kn.daemon.metric("plexus_requests_total", verb="ADD", result="ok") == adds_before + 1
    assert {eth0_ip, net1_ip} <= set(kn.node.reserved_ips())
    assert node_veths(kn), "no host end of the pod's veth on the node"

    kn.delete_pod(namespace, "web")
    check_gone(kn, uid, sandbox.id, netns, [eth0_ip, net1_ip])
    assert kn.records() == records_before
    assert kn.node.reserved_ips() == reserved_before
    assert node_veths(kn) == []


@pytest.fixture(scope="module")
def device_plugin(kubelet_node: KubeletNode) -> Iterator[DevicePlugin]:
    plugin = DevicePlugin(kubelet_node, RESOURCE_NAME, PF, VFS)
    plugin.start()
    try:
        yield plugin
    finally:
        code = plugin.stop()
        assert code == 0, f"device plugin exited with {code}"


def run_vf_pod(
    kn: KubeletNode, plugin: DevicePlugin, namespace: str, name: str
) -> tuple[str, str, str, list[str]]:
    """A pod asking for one VF and a NAD with that resource: check the VF reached both the
    container (Allocate) and network-status (PodResources); return uid, sandbox, netns, IPs."""
    pod = kn.run_pod(namespace, kn.pod_manifest(name, "vf-net", limits={RESOURCE: "1"}))
    uid = pod["metadata"]["uid"]
    entries = network_status(kn, namespace, name)
    (sandbox,) = kn.sandboxes(uid, ready_only=True)
    netns = kn.sandbox_netns(sandbox.id)
    links = addresses(netns)

    # Allocate: the kubelet put the device plugin's env into the container's OCI spec.
    (container,) = kn.containers(sandbox.id)
    env = kn.container_env(container.id)
    allocated = env.get(RESOURCE_ENV, "")
    assert allocated in VFS, (env, tail_of(plugin))

    # PodResources: the daemon asked the kubelet which VF the pod holds (there is no
    # checkpoint fallback in this node's config) and reported its device-info.
    assert [(e["name"], e["interface"]) for e in entries] == [
        ("default-net", "eth0"),
        (f"{namespace}/vf-net", "net1"),
    ]
    vf_entry = entries[1]
    assert vf_entry["device-info"]["type"] == "pci"
    assert vf_entry["device-info"]["pci"]["pci-address"] == allocated
    assert (vf_entry["ips"], vf_entry["mac"]) == (links["net1"]["ips"], links["net1"]["mac"])
    # The device ID went into the NAD's config, as Multus injects it (macvlan ignores it).
    vf_delegate = kn.record(sandbox.id)["delegates"][1]
    assert (vf_delegate["resource_name"], vf_delegate["device_id"]) == (RESOURCE, allocated)
    assert vf_delegate["config"]["deviceID"] == vf_delegate["config"]["pciBusID"] == allocated
    (ip,) = vf_entry["ips"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(VF_SUBNET)
    return uid, sandbox.id, netns, [*links["eth0"]["ips"], ip]


def tail_of(plugin: DevicePlugin) -> str:
    return plugin.log.read_text(errors="replace")[-3000:] if plugin.log.exists() else ""


def test_device_plugin_registers_and_the_pod_gets_a_vf(
    kubelet_node: KubeletNode, device_plugin: DevicePlugin, namespace: str
) -> None:
    kn = kubelet_node
    kn.wait_allocatable(RESOURCE, str(len(VFS)), device_plugin.log)
    create_nad(kn.cluster, namespace, "vf-net", kn.node.macvlan_conf(VF_SUBNET), resource=RESOURCE)
    devinfo = kn.devinfo_dir / "cni"

    uid, sandbox_id, netns, ips = run_vf_pod(kn, device_plugin, namespace, "vf-pod")
    assert len(list(devinfo.iterdir())) == 1  # the attachment's copy of the device-info

    kn.delete_pod(namespace, "vf-pod")
    check_gone(kn, uid, sandbox_id, netns, ips)
    assert list(devinfo.iterdir()) == []


def test_device_plugin_registers_again_after_a_kubelet_restart(
    kubelet_node: KubeletNode, device_plugin: DevicePlugin, namespace: str
) -> None:
    kn = kubelet_node
    kn.wait_allocatable(RESOURCE, str(len(VFS)), device_plugin.log)
    registered = device_plugin.registrations()
    assert registered >= 1

    kn.restart_kubelet()  # the new kubelet wipes its device-plugins dir
    kn.wait_for(
        "the device plugin to register with the restarted kubelet",
        lambda: device_plugin.registrations() > registered,
        device_plugin.log,
    )
    kn.wait_allocatable(RESOURCE, str(len(VFS)), device_plugin.log)

    # The new kubelet admits and allocates through the re-registered plugin.
    create_nad(kn.cluster, namespace, "vf-net", kn.node.macvlan_conf(VF_SUBNET), resource=RESOURCE)
    uid, sandbox_id, netns, ips = run_vf_pod(kn, device_plugin, namespace, "after-restart")
    kn.delete_pod(namespace, "after-restart")
    check_gone(kn, uid, sandbox_id, netns, ips)


def test_device_plugin_registers_through_the_plugin_watcher(kubelet_node: KubeletNode) -> None:
    kn = kubelet_node
    plugin = DevicePlugin(kn, "watched_vfs", PF, VFS, registration="watcher")
    plugin.start()
    try:
        # no Register call: the kubelet finds the socket, asks GetInfo, then connects
        kn.wait_allocatable("intel.com/watched_vfs", str(len(VFS)), plugin.log)
        assert "registered by the kubelet plugin watcher" in tail_of(plugin)
        assert not list(kn.kubelet.device_plugins_dir.glob("plexus-intel.com_watched_vfs*"))
    finally:
        assert plugin.stop() == 0, tail_of(plugin)
