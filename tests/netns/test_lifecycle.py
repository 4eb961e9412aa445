"""Rollback, DEL in every state, CHECK, STATUS, GC and concurrency, on real namespaces."""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cni.errors import ErrorCode
from tests.netns.conftest import Node, sh

# What a plugin reports when its CHECK finds the container not as its ADD left it: the
# reference plugins' generic code (Go's types.ErrInternal; the spec leaves every code from
# 100 up to the plugin, and defines none of 1-99 for this), passed through by the engine.
PLUGIN_ERROR = 999


def _cached_results(cni_dir: Path) -> dict[str, list[str]]:
    """The libcni result cache (`<cniDir>/results`, cni/cache.py): file names by container."""
    results = cni_dir / "results"
    found: dict[str, list[str]] = {}
    for path in sorted(results.iterdir()) if results.exists() else []:
        container = json.loads(path.read_bytes())["containerId"]
        found.setdefault(container, []).append(path.name)
    return found


def _attached_pod(node: Node, name: str = "p") -> str:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod(name, "macvlan-net")
    netns = node.pod_netns()
    node.ok("ADD", netns=netns, cid=f"c-{name}", pod=name)
    assert node.links(netns) == ["eth0", "lo", "net1"]
    return netns


def test_failed_second_delegate_rolls_back_the_first(node: Node) -> None:
    node.nad("broken", node.macvlan_conf(master="no-such-master"))
    node.pod("rb", "broken")
    netns = node.pod_netns()

    error = node.error("ADD", netns=netns, cid="c-rb", pod="rb")

    assert "default/broken" in error["msg"] and "net1" in error["msg"]
    assert node.links(netns) == ["lo"]
    assert node.reserved_ips() == []
    assert not (node.cni_dir / "records" / "c-rb").exists()


def test_del_twice_is_idempotent(node: Node) -> None:
    netns = _attached_pod(node)
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def test_del_after_netns_is_gone_releases_ips(node: Node) -> None:
    netns = _attached_pod(node)
    sh("ip", "netns", "del", node.pods.pop())
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    assert node.reserved_ips() == []


def test_del_without_netns_path(node: Node) -> None:
    _attached_pod(node)
    node.ok("DEL", cid="c-p", pod="p")
    assert node.reserved_ips() == []


def test_del_after_pod_and_nad_are_removed(node: Node) -> None:
    netns = _attached_pod(node)
    node.remove("pod-default-p.yaml")
    node.remove("nad-default-macvlan-net.yaml")
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def test_del_without_attachment_record_uses_the_result_cache(node: Node) -> None:
    netns = _attached_pod(node)
    shutil.rmtree(node.cni_dir / "records")
    node.remove("nad-default-macvlan-net.yaml")
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def test_del_with_no_cache_at_all_resolves_from_the_pod(node: Node) -> None:
    netns = _attached_pod(node)
    shutil.rmtree(node.cni_dir)
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def test_twenty_concurrent_adds_then_dels(node: Node) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    pods = [f"c{i}" for i in range(20)]
    spaces = {}
    for pod in pods:
        node.pod(pod, "macvlan-net")
        spaces[pod] = node.pod_netns()

    with ThreadPoolExecutor(max_workers=20) as pool:
        added = list(
            pool.map(lambda p: node.cni("ADD", netns=spaces[p], cid=f"c-{p}", pod=p), pods)
        )
    assert [d.returncode for d in added] == [0] * 20, [d.stdout for d in added if d.returncode]
    ips = [ip for pod in pods for s in node.network_status(pod) for ip in s["ips"]]
    assert len(ips) == 40 and len(set(ips)) == 40
    assert len(node.reserved_ips()) == 40
    cached = _cached_results(node.cni_dir)
    assert sorted(cached) == sorted(f"c-{p}" for p in pods)
    assert all(len(names) == 2 for names in cached.values()), cached  # eth0 and net1

    with ThreadPoolExecutor(max_workers=20) as pool:
        deleted = list(
            pool.map(lambda p: node.cni("DEL", netns=spaces[p], cid=f"c-{p}", pod=p), pods)
        )
    assert [d.returncode for d in deleted] == [0] * 20
    assert node.reserved_ips() == []
    assert all(node.links(spaces[p]) == ["lo"] for p in pods)
    assert list((node.cni_dir / "records").iterdir()) == []
    assert _cached_results(node.cni_dir) == {}
    assert list((node.cni_dir / "results").iterdir()) == []  # no stray temporary files


def test_check_passes_then_fails_when_an_address_is_removed(node: Node) -> None:
    netns = _attached_pod(node)
    node.ok("CHECK", netns=netns, cid="c-p", pod="p")
    address = node.network_status("p")[1]["ips"][0]
    sh("ip", "addr", "del", f"{address}/16", "dev", "net1", netns=node.pods[0])

    error = node.error("CHECK", netns=netns, cid="c-p", pod="p")

    assert "default/macvlan-net (net1, macvlan)" in error["details"]
    assert error["code"] == PLUGIN_ERROR
    assert error["code"] not in set(ErrorCode)  # not a spec code claiming another cause


def test_check_of_an_unknown_container(node: Node) -> None:
    error = node.error("CHECK", netns=node.pod_netns(), cid="c-none", pod="none")
    assert error["code"] == 3


def test_status_follows_the_default_network_only(node: Node) -> None:
    node.ok("STATUS")
    broken_secondary = node.meta(
        delegates=[
            node.bridge_conf(),
            {"cniVersion": "1.1.0", "name": "gone", "type": "no-such-plugin"},
        ]
    )
    node.ok("STATUS", conf=broken_secondary)
    broken_default = node.meta(
        delegates=[{"cniVersion": "1.1.0", "name": "gone", "type": "no-such-plugin"}]
    )
    error = node.error("STATUS", conf=broken_default)
    assert "no-such-plugin" in error["msg"]


def test_gc_removes_stale_attachments_secondary_included(node: Node) -> None:
    kept = _attached_pod(node, "keep")
    node.pod("drop", "macvlan-net")
    dropped = node.pod_netns()
    node.ok("ADD", netns=dropped, cid="c-drop", pod="drop")
    assert len(node.reserved_ips()) == 4

    conf = node.meta(**{"cni.dev/valid-attachments": [{"containerID": "c-keep", "ifname": "eth0"}]})
    node.ok("GC", conf=conf)

    assert node.links(dropped) == ["lo"]
    assert node.links(kept) == ["eth0", "lo", "net1"]
    kept_ips = sorted(ip for s in node.network_status("keep") for ip in s["ips"])
    assert node.reserved_ips() == kept_ips
    assert [p.name for p in (node.cni_dir / "records").iterdir()] == ["c-keep"]


def test_malformed_stdin_is_a_decode_error_not_a_traceback(node: Node) -> None:
    bad = subprocess.run(
        [str(node.bin / "plexus")],
        input="{not json",
        env={
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "c",
            "CNI_NETNS": "/x",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": str(node.bin),
        },
        capture_output=True,
        text=True,
    )
    error = json.loads(bad.stdout)
    assert bad.returncode == 1 and error["code"] == 6
    assert "Traceback" not in bad.stdout
