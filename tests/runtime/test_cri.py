"""containerd's CRI plugin runs Plexus as a kubelet-driven node would: RunPodSandbox, Stop, Remove.

Each pod's annotation asks for the `macvlan-net` NAD (macvlan on the node's `uplink0`) on
top of the default network (reference bridge + host-local). Every test compares what the
runtime reports with the kernel state of the sandbox's netns and with what Plexus wrote,
then checks that Stop + Remove leave nothing behind.
"""

from __future__ import annotations

import ipaddress
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as cri

from meta.daemon import protocol
from tests.netns.daemon import Daemon
from tests.runtime.conftest import Pods, Runtime, addresses, in_netns

pytestmark = pytest.mark.runtime

NAD = "macvlan-net"
SECONDARY_SUBNET = "10.98.0.0/16"
DEFAULT_SUBNET = "10.99.0.0/16"  # the node's bridge_conf()


@dataclass
class Attached:
    sandbox_id: str
    netns: str
    eth0: list[str]
    net1: list[str]


@pytest.fixture(autouse=True)
def macvlan_nad(runtime: Runtime) -> None:
    runtime.node.nad(NAD, runtime.node.macvlan_conf(SECONDARY_SUBNET))


@pytest.fixture(params=["daemon", "thin"])
def mode(request: pytest.FixtureRequest, runtime: Runtime) -> Daemon | None:
    """The shim forwarding to `plexus daemon`, or (no daemon socket) falling back to plexus-thin."""
    if request.param == "daemon":
        daemon: Daemon = request.getfixturevalue("daemon")
        return daemon
    assert not (runtime.node.root / "run" / protocol.SOCKET_NAME).exists()
    return None


def served(daemon: Daemon | None, verb: str) -> float:
    return daemon.metric("plexus_requests_total", verb=verb, result="ok") if daemon else 0.0


def check_attached(rt: Runtime, pod: str, sandbox_id: str) -> Attached:
    """The sandbox is ready with eth0 + net1, and every record of them agrees with the kernel."""
    status, _ = rt.containerd.status(sandbox_id)
    assert status.state == cri.PodSandboxState.SANDBOX_READY
    netns = rt.containerd.netns_path(sandbox_id)
    assert Path(netns).name in rt.netns_names(), netns
    links = addresses(netns)
    assert sorted(links) == ["eth0", "lo", "net1"]

    # The runtime reports eth0's addresses (what the kubelet puts in the pod's status).
    reported = [status.network.ip, *(extra.ip for extra in status.network.additional_ips)]
    assert links["eth0"]["ips"] == reported
    assert ipaddress.ip_address(reported[0]) in ipaddress.ip_network(DEFAULT_SUBNET)
    default_routes = json.loads(in_netns(netns, "ip", "-j", "route", "show", "default"))
    assert [r["dev"] for r in default_routes] == ["eth0"], default_routes
    assert len(links["net1"]["ips"]) == 1
    assert ipaddress.ip_address(links["net1"]["ips"][0]) in ipaddress.ip_network(SECONDARY_SUBNET)

    # network-status, written by Plexus into the pod's manifest in the embedded store.
    entries = rt.node.network_status(pod)
    assert [(e["name"], e["interface"], e["ips"], e["mac"]) for e in entries] == [
        ("default-net", "eth0", links["eth0"]["ips"], links["eth0"]["mac"]),
        (f"default/{NAD}", "net1", links["net1"]["ips"], links["net1"]["mac"]),
    ]
    assert entries[0].get("default") is True and not entries[1].get("default")

    # Plexus's attachment record, host-local's reservations, containerd's libcni cache.
    assert sandbox_id in rt.records()
    reserved = rt.node.reserved_ips()
    assert set(links["eth0"]["ips"] + links["net1"]["ips"]) <= set(reserved)
    assert f"{rt.network}-{sandbox_id}-eth0" in rt.libcni_results()
    return Attached(sandbox_id, netns, links["eth0"]["ips"], links["net1"]["ips"])


def check_released(rt: Runtime, before: dict[str, Any], gone: list[Attached]) -> None:
    for pod in gone:
        assert not Path(pod.netns).exists(), f"{pod.netns} still exists"
        assert pod.sandbox_id not in rt.records()
        assert not set(pod.eth0 + pod.net1) & set(rt.node.reserved_ips())
    assert rt.snapshot() == before


def test_run_pod_sandbox_attaches_eth0_and_net1(
    runtime: Runtime, pods: Pods, mode: Daemon | None
) -> None:
    name = f"web-{'daemon' if mode else 'thin'}"
    pods.create(name, NAD)
    attached = check_attached(runtime, name, pods.run(name))
    if mode is not None:
        assert served(mode, "ADD") == 1
    added = [e["message"] for e in runtime.node.events() if e["pod"] == name]
    assert any(f"net1 [{attached.net1[0]}/16]" in m and NAD in m for m in added), added


def test_stop_and_remove_pod_sandbox_release_everything(
    runtime: Runtime, pods: Pods, mode: Daemon | None
) -> None:
    name = f"db-{'daemon' if mode else 'thin'}"
    before = runtime.snapshot()
    pods.create(name, NAD)
    attached = check_attached(runtime, name, pods.run(name))
    pods.stop_and_remove(name)
    check_released(runtime, before, [attached])
    if mode is not None:
        assert served(mode, "DEL") >= 1


def test_missing_nad_fails_run_pod_sandbox_and_leaks_nothing(
    runtime: Runtime, pods: Pods, mode: Daemon | None
) -> None:
    name = f"broken-{'daemon' if mode else 'thin'}"
    before = runtime.snapshot()
    pods.create(name, f"{NAD}, missing-net")
    with pytest.raises(grpc.RpcError) as failed:
        pods.run(name)
    # containerd surfaces the CNI error of the meta-plugin in the CRI error.
    assert "cannot find a network-attachment-definition (default/missing-net)" in str(
        failed.value.details()
    )
    reasons = [e["reason"] for e in runtime.node.events() if e["pod"] == name]
    assert "NoNetworkFound" in reasons, reasons
    check_released(runtime, before, [])


def test_concurrent_sandboxes(runtime: Runtime, pods: Pods, mode: Daemon | None) -> None:
    names = [f"burst-{'daemon' if mode else 'thin'}-{i}" for i in range(4)]
    before = runtime.snapshot()
    for name in names:
        pods.create(name, NAD)
    with ThreadPoolExecutor(len(names)) as pool:
        sandbox_ids = list(pool.map(pods.run, names))
    attached = [check_attached(runtime, n, s) for n, s in zip(names, sandbox_ids, strict=True)]
    ips = [ip for a in attached for ip in a.eth0 + a.net1]
    assert len(ips) == len(set(ips)) == 2 * len(names)
    if mode is not None:
        assert served(mode, "ADD") == len(names)
    with ThreadPoolExecutor(len(names)) as pool:
        list(pool.map(pods.stop_and_remove, names))
    check_released(runtime, before, attached)


def test_daemon_restart_between_run_and_stop(runtime: Runtime, pods: Pods, daemon: Daemon) -> None:
    name = "restarted"
    before = runtime.snapshot()
    pods.create(name, NAD)
    attached = check_attached(runtime, name, pods.run(name))
    daemon.stop()
    daemon.start()
    pods.stop_and_remove(name)
    assert served(daemon, "DEL") >= 1  # the new daemon, from the record the old one wrote
    check_released(runtime, before, [attached])
