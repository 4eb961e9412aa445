"""Two real nodes on one shared L2 for the cluster tier, with the controllers running.

`TwoNodes.start()` starts kube-controller-manager and kube-scheduler on the session's
control plane (DaemonSet pods are placed by the scheduler), then two `KubeletNode`s
(tests/cluster/kubelet.py: each its own node namespace, containerd, kubelet, node name,
node IP and primary pod subnet) in parallel, without Plexus. The first runs containerd
2.x, the second Debian's 1.6: a mixed cluster, as during a runtime upgrade. A `Lan` joins
them: a namespace of its own holding the bridge `lan0`, into which each node's uplink (the
macvlan master `uplink0`) is plugged through its veth peer, so a macvlan on node 1 reaches
a macvlan on node 2 and no frame leaves the namespaces the test made. `install_plexus()` is
the one place that puts Plexus on the nodes.

The macvlan NAD's IPAM is whereabouts, served in process by each node's daemon: its pool
is an IPPool on the API server, and the nodes share no IPAM state on disk (each has its
own /var/lib/cni), so pods on the two nodes never get the same address only because the
cluster-wide IPAM works.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from delegates.ipam.whereabouts.ranges import pool_name
from delegates.netns import run_in_netns
from meta.daemon.config import NETWORK_NAME
from tests.cluster import install, kubelet
from tests.cluster.apiserver import CONTROLLERS, Cluster, binary
from tests.cluster.forward import LoopbackForward
from tests.cluster.kubelet import KubeletNode, network_status, run_all
from tests.cluster.whereabouts import allocations, install_crds, install_ipam_rbac
from tests.netns.conftest import Node, sh
from tests.runtime import containerd as ctrd
from tests.runtime.conftest import addresses

UPLINK_PEER = "uplink1"  # Node's other end of its uplink veth
BRIDGE = "lan0"
# Per node: node IP (on its own `kubenode0`) and primary pod subnet (inside Node.bridge_conf's).
NODE_ADDRESSES = (("192.0.2.11", "10.99.1.0/24"), ("192.0.2.12", "10.99.2.0/24"))
RELEASES = (ctrd.BUILT, ctrd.DEBIAN)  # per node: its containerd
LAN_SUBNET = "10.94.0.0/24"  # the LAN NAD: one whereabouts range for both nodes
POOLS_NAMESPACE = "kube-system"  # the daemons' whereaboutsNamespace (its default)
MAX_PODS = 40  # room for pod bursts (an upgrade scenario), the daemons and the test pods

Json = dict[str, Any]


def missing_binaries() -> list[str]:
    """What the two-node tier needs beyond one kubelet node, if absent."""
    return (
        kubelet.missing_binaries()
        + ctrd.DEBIAN.missing()
        + [str(binary(name)) for name in (*CONTROLLERS, "kubectl") if not binary(name).exists()]
    )


class Lan:
    """A shared L2 segment: a bridge in a namespace of its own, node uplinks as its ports."""

    def __init__(self) -> None:
        self.netns = f"pxt-lan-{uuid.uuid4().hex[:6]}"
        sh("ip", "netns", "add", self.netns)
        sh("ip", "link", "add", BRIDGE, "type", "bridge", netns=self.netns)
        sh("ip", "link", "set", BRIDGE, "up", netns=self.netns)

    def plug(self, node: Node, port: str) -> None:
        """Move the peer of the node's uplink in here, as bridge port `port`."""
        sh("ip", "link", "set", UPLINK_PEER, "netns", self.netns, "name", port, netns=node.name)
        sh("ip", "link", "set", port, "master", BRIDGE, "up", netns=self.netns)

    def learned(self) -> dict[str, str]:
        """MAC -> bridge port, for the addresses the bridge learned from frames."""
        out = sh("bridge", "-j", "fdb", "show", "br", BRIDGE, netns=self.netns).stdout
        return {
            e["mac"]: e["ifname"]
            for e in json.loads(out)
            if "permanent" not in e.get("state", "") and "self" not in e.get("flags", [])
        }

    def close(self) -> None:
        sh("ip", "netns", "del", self.netns, check=False)  # takes the ports' veths along


class TwoNodes:
    """The control plane's controllers, two Ready nodes and the LAN between them."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.root = Path(tempfile.mkdtemp(prefix="pxt-two-"))
        self.lan: Lan | None = None
        self.nodes: list[KubeletNode] = []
        self.startup_seconds = 0.0
        self.install_seconds = 0.0
        self.image = ""  # the Plexus image the nodes run ("": started by hand)
        self.installed = False  # Plexus on the nodes (a test may uninstall it)
        self.forwards: list[LoopbackForward] = []

    def start(self) -> None:
        began = time.monotonic()
        self.cluster.start_controllers()
        # kube-system's `default` ServiceAccount, as the serviceaccount controller (not
        # run) makes in a real cluster: pods there without their own account need it.
        self.cluster.create_namespace("kube-system")
        # The LAN NAD's IPAM keeps its pools in whereabouts' CRDs, which the daemons need
        # the rights to: the install applies both; daemons started by hand need them too.
        install_crds(self.cluster)
        install_ipam_rbac(self.cluster)
        self.lan = Lan()
        for (node_ip, pod_subnet), release in zip(NODE_ADDRESSES, RELEASES, strict=True):
            self.nodes.append(KubeletNode(self.cluster, node_ip, pod_subnet, MAX_PODS, release))
            self.lan.plug(self.nodes[-1].node, f"port{len(self.nodes) - 1}")
        # One after the other, from this thread: the kubelet's PDEATHSIG follows the thread
        # that started it, so a worker thread's exit would kill it.
        for kn in self.nodes:
            kn.start(with_daemon=False)
            # The kubelet registers with the not-ready taint; the node lifecycle controller
            # lifts it once Ready. That controller is not run (it evicts pods from a node
            # whose heartbeats lag, which load here can cause): this does its lifting.
            self.cluster.merge_patch(f"/api/v1/nodes/{kn.name}", {"spec": {"taints": None}})
        self.startup_seconds = time.monotonic() - began

    def install_plexus(self) -> None:
        """Put Plexus on every node; return once each node's containerd sets pods up
        through it. From the image and crds/ when this tree can build the image
        (tests/cluster/install.py), else `plexus daemon` started by hand on each node."""
        began = time.monotonic()
        if install.available():
            self.image = install.IMAGE
            archive = install.build_image(self.image)
            for kn in self.nodes:
                self.forwards.append(install.serve_cluster_ip(kn))
                install.remove_hand_installed(kn)
            with ThreadPoolExecutor(len(self.nodes)) as pool:  # ~30 s each: in parallel
                jobs = [
                    pool.submit(install.import_image, kn, archive, self.image) for kn in self.nodes
                ]
                for job in jobs:
                    job.result()
            install.apply(self.cluster, self.image)
            install.wait_daemonset(self.cluster, self.nodes, self.image)
        else:
            for kn in self.nodes:
                kn.start_daemon()
        self.wait_installed()
        self.install_seconds = time.monotonic() - began

    def wait_installed(self) -> None:
        for kn in self.nodes:
            kn.wait_cni_network(NETWORK_NAME)
        self.installed = True

    def uninstall_plexus(self) -> None:
        """The install deleted and crds/uninstall run on every node (install.uninstall)."""
        self.installed = False
        try:
            install.uninstall(self.cluster, self.image, self.nodes)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.dump()}") from None

    def ensure_plexus(self) -> None:
        """Plexus on the nodes again after uninstall_plexus(), from the same image."""
        if not self.installed:
            install.apply(self.cluster, self.image)
            install.wait_daemonset(self.cluster, self.nodes, self.image)
            self.wait_installed()

    def dump(self, namespace: str = "") -> str:
        """The state a lifecycle failure is read from: pods (the test's and kube-system's),
        events, the daemon pods' logs, each node's kubelet/containerd/daemon log tails."""
        lines = []
        for ns in [n for n in (namespace, "kube-system") if n]:
            for pod in self.cluster.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
                meta, status = pod["metadata"], pod.get("status", {})
                containers = [
                    (c["name"], c.get("ready"), c.get("restartCount"), list(c.get("state", {})))
                    for c in status.get("containerStatuses") or []
                ]
                lines.append(
                    f"pod {ns}/{meta['name']} node={pod['spec'].get('nodeName')} "
                    f"phase={status.get('phase')} deleting={'deletionTimestamp' in meta} "
                    f"image={pod['spec']['containers'][0]['image']} {containers}"
                )
            for event in self.cluster.get(f"/api/v1/namespaces/{ns}/events")["items"][-40:]:
                lines.append(
                    f"event {ns}/{event['involvedObject'].get('name')} {event.get('reason')}: "
                    f"{str(event.get('message'))[:300]}"
                )
        logs = install.daemon_logs(self.nodes)
        nodes = "\n".join(f"=== {kn.name}\n{kn.diagnostics()}" for kn in self.nodes)
        return "\n".join(lines) + f"\n{logs}\n{nodes}"

    def macvlan_conf(self, subnet: str) -> Json:
        """A macvlan NAD config on the nodes' uplinks (same name on every node), its
        addresses from whereabouts (in process: one IPPool for both nodes)."""
        conf = self.nodes[0].node.macvlan_conf(subnet)
        conf["ipam"] = {"type": "whereabouts", "range": subnet}
        return conf

    def reserved_ips(self) -> list[str]:
        """Addresses the LAN NAD's IPPool holds (in the daemons' whereaboutsNamespace)."""
        base = ipaddress.ip_network(LAN_SUBNET).network_address
        held = allocations(self.cluster, POOLS_NAMESPACE, pool_name(LAN_SUBNET))
        return sorted(str(base + int(key)) for key in held)

    def close(self) -> None:
        """Undo start(), whatever it reached: every step runs; the first error is raised."""
        run_all(
            [
                # The GC deletes the DaemonSet's pods; then no controller makes new ones.
                lambda: install.delete_daemonset(self.cluster) if self.image else None,
                lambda: (
                    install.delete_daemonset(self.cluster, install.UNINSTALL_NAME)
                    if self.image
                    else None
                ),
                self.cluster.stop_controllers,
                *(forward.stop for forward in self.forwards),
                *(kn.close for kn in self.nodes),
                lambda: self.lan.close() if self.lan is not None else None,
                lambda: shutil.rmtree(self.root, ignore_errors=True),
            ]
        )


class PodOnNode:
    """A Running pod as the test sees it: its node, sandbox netns, interfaces, status."""

    def __init__(self, kn: KubeletNode, namespace: str, name: str) -> None:
        self.kn = kn
        self.name = name
        self.uid = kn.wait_running(namespace, name)["metadata"]["uid"]
        self.entries = network_status(kn, namespace, name)
        (sandbox,) = kn.sandboxes(self.uid, ready_only=True)
        self.sandbox_id = sandbox.id
        self.netns = kn.sandbox_netns(sandbox.id)
        self.links = addresses(self.netns)

    def ip(self, ifname: str) -> str:
        (address,) = self.links[ifname]["ips"]
        return str(address)


def check_networks(pod: PodOnNode, namespace: str) -> None:
    """eth0 from the node's primary network, net1 from the LAN NAD, network-status true."""
    assert sorted(pod.links) == ["eth0", "lo", "net1"]
    assert [(e["name"], e["interface"], e["ips"], e["mac"]) for e in pod.entries] == [
        ("default-net", "eth0", [pod.ip("eth0")], pod.links["eth0"]["mac"]),
        (f"{namespace}/lan-net", "net1", [pod.ip("net1")], pod.links["net1"]["mac"]),
    ]
    assert pod.entries[0].get("default") is True and not pod.entries[1].get("default")
    assert ipaddress.ip_address(pod.ip("eth0")) in ipaddress.ip_network(pod.kn.pod_subnet)
    assert ipaddress.ip_address(pod.ip("net1")) in ipaddress.ip_network(LAN_SUBNET)
    assert pod.sandbox_id in pod.kn.records()
    # The in-process macvlan's sysctl landed, as the reference plugin's does, though an
    # installed daemon's container (not privileged) has a read-only /proc/sys of its own.
    arp_notify = Path("/proc/sys/net/ipv4/conf/net1/arp_notify")
    assert run_in_netns(pod.netns, lambda: arp_notify.read_text().strip()) == "1"
