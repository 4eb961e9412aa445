"""The node's state under faults: unreadable records and caches, leases left behind,
racing thin-mode calls, a repeated ADD. Real namespaces, reference plugins, the shim."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest

from cni.errors import ErrorCode
from tests.netns.conftest import Node, sh
from tests.netns.test_lifecycle import _attached_pod as attached_pod

pytestmark = pytest.mark.netns

PLEXUS = Path(sys.executable).with_name("plexus")


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def _warnings(node: Node, about: str) -> list[dict[str, Any]]:
    """Warning lines of the plugin's log that name `about`."""
    lines = [json.loads(line) for line in (node.root / "plexus.log").read_text().splitlines()]
    return [line for line in lines if line["level"] == "warning" and about in json.dumps(line)]


def _inspect(node: Node) -> dict[str, Any]:
    config = node.root / "inspect.json"
    config.write_text(json.dumps(node.meta()))
    done = subprocess.run(
        [str(PLEXUS), "inspect", "--config", str(config), "--json"], capture_output=True, text=True
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _all_released(node: Node, netns: str) -> None:
    assert node.links(netns) == ["lo"]
    assert node.reserved_ips() == []
    assert _files(node.cni_dir / "records") == []
    assert _files(node.cni_dir / "results") == []


# ---- unreadable records and cache files -------------------------------------------


@pytest.mark.parametrize(
    ("damage", "lose_cache"),
    [("", False), ('{"container_id": ', True)],
    ids=["zero-length-record-then-result-cache", "corrupt-record-then-pod-networks"],
)
def test_del_with_an_unreadable_record_falls_back(
    node: Node, damage: str, lose_cache: bool
) -> None:
    netns = attached_pod(node)
    record = node.cni_dir / "records" / "c-p"
    record.write_text(damage)  # what a crash before the data reached the disk leaves
    if lose_cache:
        shutil.rmtree(node.cni_dir / "results")

    node.ok("DEL", netns=netns, cid="c-p", pod="p")

    _all_released(node, netns)
    (warning,) = _warnings(node, str(record))
    assert warning["msg"] == "unreadable attachment record: treating it as lost"


def test_gc_does_not_skip_an_unreadable_record(node: Node) -> None:
    netns = attached_pod(node)
    record = node.cni_dir / "records" / "c-p"
    record.write_text("")
    report = _inspect(node)
    assert not report["healthy"] and report["containers"] == []
    assert [line.split(":")[0] for line in report["unreadable"]] == [str(record)]

    node.ok("GC", conf=node.meta(**{"cni.dev/valid-attachments": []}))

    _all_released(node, netns)


def test_gc_keeps_a_valid_container_whose_record_is_unreadable(node: Node) -> None:
    netns = attached_pod(node)
    ips = node.reserved_ips()
    (node.cni_dir / "records" / "c-p").write_text("")

    valid = [{"containerID": "c-p", "ifname": "eth0"}]
    node.ok("GC", conf=node.meta(**{"cni.dev/valid-attachments": valid}))

    assert node.links(netns) == ["eth0", "lo", "net1"] and node.reserved_ips() == ips
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    _all_released(node, netns)


def test_a_corrupt_result_cache_file_is_reported_and_does_not_block_del(node: Node) -> None:
    netns = attached_pod(node)
    shutil.rmtree(node.cni_dir / "records")
    cached = node.cni_dir / "results" / "macvlan-net-c-p-net1"
    cached.write_text("{not json")
    report = _inspect(node)
    assert not report["healthy"]
    assert [line.split(":")[0] for line in report["unreadable"]] == [str(cached)]

    node.ok("DEL", netns=netns, cid="c-p", pod="p")

    _all_released(node, netns)
    (warning,) = _warnings(node, str(cached))
    assert warning["msg"].startswith("unreadable CNI cache file: removing it")


def test_add_makes_its_record_and_cache_durable(node: Node) -> None:
    """Before ADD answers, the record and every cached result are fsynced, and so are
    their directories (the names): what a crash right after the answer must not lose.
    strace shows each fsync with its file's path."""
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("p", "macvlan-net")
    trace = node.root / "fsync.trace"
    strace = ("strace", "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o", str(trace))
    node.ok("ADD", netns=node.pod_netns(), cid="c-p", pod="p", wrapper=strace)
    synced = {Path(p) for p in re.findall(r"fsync\(\d+<([^>]+)>", trace.read_text())}
    records, results = node.cni_dir / "records", node.cni_dir / "results"
    cached = sorted(results.glob("*-c-p-*"))
    assert len(cached) == 2, cached  # the default network and net1
    for path in [records / "c-p", *cached, records, results]:
        assert path.resolve() in synced, f"{path} not fsynced; fsyncs: {sorted(synced)}"


# ---- leases nothing owns ------------------------------------------------------------


def test_gc_releases_leases_left_when_record_and_pod_are_gone(node: Node) -> None:
    kept = attached_pod(node, "keep")
    kept_ips = node.reserved_ips()
    gone = node.pod_netns()
    node.pod("gone", "macvlan-net")
    node.ok("ADD", netns=gone, cid="c-gone", pod="gone")
    # another CNI user's lease in the same data dir, in a range Plexus never used
    foreign = node.ipam / "other-net" / "10.1.0.5"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(b"c-foreign\r\neth0")
    # the node reboots (namespaces gone) and the record and cache are lost; the pod is
    # deleted, then the runtime's late DEL can only find the default network
    sh("ip", "netns", "del", node.pods.pop())
    (node.cni_dir / "records" / "c-gone").unlink()
    for path in (node.cni_dir / "results").glob("*-c-gone-*"):
        path.unlink()
    node.remove("pod-default-gone.yaml")
    node.ok("DEL", netns=gone, cid="c-gone", pod="gone")
    (leaked,) = _inspect(node)["orphan_leases"]
    assert (leaked["network"], leaked["container_id"], leaked["ifname"]) == (
        "macvlan-net",
        "c-gone",
        "net1",
    )

    valid = [{"containerID": "c-keep", "ifname": "eth0"}]
    node.ok("GC", conf=node.meta(**{"cni.dev/valid-attachments": valid}))

    assert sorted([*kept_ips, "10.1.0.5"]) == node.reserved_ips()
    assert node.links(kept) == ["eth0", "lo", "net1"]
    report = _inspect(node)
    assert report["healthy"], report


# ---- thin-mode calls of one container exclude each other ----------------------------


def _gated_network(node: Node, gate: Path) -> None:
    """NAD gated-net: macvlan chained with a plugin whose ADD waits until `gate` exists."""
    plugin = node.bin / "gated"
    plugin.write_text(
        "#!/bin/sh\n# a chained plugin that holds its ADD until the test opens the gate\n"
        '[ "$CNI_COMMAND" = ADD ] || exit 0\n'
        f'while [ ! -e "{gate}" ]; do sleep 0.05; done\n'
        "python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)[\"prevResult\"]))'\n"
    )
    plugin.chmod(0o755)
    node.nad(
        "gated-net",
        {
            "cniVersion": "1.0.0",
            "name": "gated-net",
            "plugins": [node.macvlan_conf(), {"type": "gated"}],
        },
    )


def test_thin_del_racing_an_add_waits_for_it(node: Node) -> None:
    gate = node.root / "gate"
    _gated_network(node, gate)
    node.pod("r", "gated-net")
    netns = node.pod_netns()
    with ThreadPoolExecutor(2) as pool:
        add = pool.submit(node.cni, "ADD", netns=netns, cid="c-r", pod="r")
        while "net1" not in node.links(netns):  # the ADD is inside the gated plugin
            assert not add.done(), add.result().stdout
        delete = pool.submit(node.cni, "DEL", netns=netns, cid="c-r", pod="r")
        # Without a lock shared by processes, the DEL runs now, under the ADD. With one
        # it waits; either way give it the time a thin call takes, then go on.
        wait([delete], timeout=5)
        gate.touch()
        added, deleted = add.result(timeout=60), delete.result(timeout=60)
    assert added.returncode == 0, added.stdout
    assert deleted.returncode == 0, deleted.stdout
    _all_released(node, netns)  # the DEL came second, and took everything back
    assert _files(node.cni_dir / "locks") == []


def test_lock_files_live_as_long_as_records(node: Node) -> None:
    netns = attached_pod(node)
    assert _files(node.cni_dir / "locks") == ["c-p"]
    assert _inspect(node)["healthy"]
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    assert _files(node.cni_dir / "locks") == []

    node.error("ADD", netns="/run/netns/no-such-netns", cid="c-x", pod="p")  # nothing kept
    (node.cni_dir / "locks" / "c-killed").touch()  # left by a call killed while it held it
    node.ok("GC", conf=node.meta(**{"cni.dev/valid-attachments": []}))
    assert _files(node.cni_dir / "locks") == []


# ---- a repeated ADD ---------------------------------------------------------------


@pytest.mark.parametrize("ifname", ["eth0", "eth1"])
def test_a_second_add_of_a_container_changes_nothing(node: Node, ifname: str) -> None:
    netns = attached_pod(node)
    before = {i: node.addresses(netns, i) for i in ("eth0", "net1")}
    ips = node.reserved_ips()

    error = node.error("ADD", netns=netns, cid="c-p", pod="p", ifname=ifname)

    assert error["code"] == ErrorCode.INVALID_ENV
    assert error["msg"].startswith("container c-p is already attached")
    assert node.links(netns) == ["eth0", "lo", "net1"]
    assert {i: node.addresses(netns, i) for i in ("eth0", "net1")} == before
    assert node.reserved_ips() == ips
    node.ok("CHECK", netns=netns, cid="c-p", pod="p")
    node.added.pop()  # the refused ADD: nothing to undo
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    _all_released(node, netns)
