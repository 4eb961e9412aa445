"""A NAD author is a tenant: what a hostile namespace admin tries, refused end to end.

Each case runs the installed `plexus` as a runtime does, through thin mode and through
the daemon where the daemon is what is attacked. A refusal must come as a CNI error
with code 7 within a second, with nothing attached, created, read or exec'd, and the
daemon must keep serving the next pod.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meta.sources.base import RESOURCE_NAME_ANNOTATION
from tests.kubelet import serve
from tests.netns.conftest import Node
from tests.netns.daemon import Daemon, running
from tests.wait import wait_for

QUICK = 1.0  # seconds a refusal may take (the daemon's container lock waits 30 s)
MARK = """#!{python} -IS
# Leaves a mark that it ran, then fails: a delegate that must never run.
import os, sys
open("{marks}", "a").write(os.environ.get("CNI_COMMAND", "") + "\\n")
print('{{"cniVersion": "1.0.0", "code": 100, "msg": "the marker ran"}}')
sys.exit(1)
"""


def _install_marker(node: Node) -> Path:
    """The `marker` plugin in the node's bin dir; the file it marks."""
    marks = node.root / "marks"
    (node.bin / "marker").write_text(MARK.format(python=sys.executable, marks=marks))
    (node.bin / "marker").chmod(0o755)
    return marks


@pytest.fixture(params=["thin", "daemon"])
def mode(request: pytest.FixtureRequest, node: Node) -> Iterator[Daemon | None]:
    """Each case in thin mode (the runtime execs Plexus itself) and through the daemon."""
    if request.param == "thin":
        yield None
        return
    with running(node) as daemon:
        yield daemon


def _refused(node: Node, words: str, netns: str, pod: str = "t", **kw: Any) -> dict[str, Any]:
    started = time.monotonic()
    error = node.error("ADD", netns=netns, cid=f"c-{pod}", pod=pod, **kw)
    took = time.monotonic() - started
    assert error["code"] == 7, error
    assert words in error["msg"] + error.get("details", ""), error
    assert took < QUICK + 2.5, f"refused after {took:.1f} s"  # the exec of Plexus included
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []
    return error


def _serves_the_next_pod(node: Node) -> None:
    node.nad("plain-net", node.macvlan_conf(subnet="10.96.0.0/16"))
    node.pod("next", "plain-net")
    netns = node.pod_netns()
    node.ok("ADD", netns=netns, cid="c-next", pod="next")
    assert node.links(netns) == ["eth0", "lo", "net1"]


# ---- Plexus as its own delegate -------------------------------------------------------


def test_a_nad_whose_type_is_plexus_is_refused_before_anything_runs(
    node: Node, mode: Daemon | None
) -> None:
    node.nad("again", {"cniVersion": "1.0.0", "type": "plexus", "delegates": []})
    node.pod("t", "again")
    _refused(node, "is Plexus itself", node.pod_netns())
    _serves_the_next_pod(node)


def test_the_meta_plugin_under_another_name_later_in_a_chain_is_refused_up_front(
    node: Node, mode: Daemon | None
) -> None:
    shutil.copy(node.bin / "plexus", node.bin / "innocent")  # a copy: not the same file
    marks = _install_marker(node)
    chain = {"cniVersion": "1.0.0", "plugins": [{"type": "marker"}, {"type": "innocent"}]}
    node.nad("chained", chain)
    node.pod("t", "chained")
    _refused(node, 'plugin "innocent" is Plexus itself', node.pod_netns())
    assert not marks.exists()  # the chain's first plugin never ran


def test_a_delegate_that_calls_the_daemon_back_is_refused(node: Node) -> None:
    """A plugin that is not Plexus but execs it (so its file holds no mark of Plexus):
    the daemon sees that the call comes from a process it started."""
    script = node.bin / "reenter"
    script.write_text(f'#!/bin/sh\nexec "{node.bin / "plexus"}"\n')
    script.chmod(0o755)
    # The daemon's socket is no secret: the generated conflist names it.
    socket_dir = str(node.root / "run")
    node.nad("reenter", {"cniVersion": "1.0.0", "type": "reenter", "socketDir": socket_dir})
    node.pod("t", "reenter")
    with running(node) as daemon:
        error = _refused(node, "which the Plexus daemon started", node.pod_netns())
        assert error["msg"].startswith("ADD of default/reenter (net1, reenter) failed")
        assert daemon.proc is not None and daemon.proc.poll() is None
        _serves_the_next_pod(node)


# ---- the daemon's config decides ------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"chrootDir": "/tmp"}, "chrootDir"),
        ({"binDir": "/tmp"}, "binDir"),
        ({"cniDir": "/etc"}, "cniDir"),
        ({"logFile": "/etc/motd"}, "logFile"),
        ({"allowedHostPaths": ["/"]}, "allowedHostPaths"),
    ],
)
def test_a_call_cannot_override_the_daemons_own_config(
    node: Node, override: dict[str, Any], key: str
) -> None:
    node.pod("t", None)
    with running(node) as daemon:
        conf = node.meta(**override)
        error = _refused(node, f"sets {key} differently", node.pod_netns(), conf=conf)
        wait_for(lambda: "stale CNI config, or an attempt" in _log(node), "the warning")
        assert daemon.proc is not None and daemon.proc.poll() is None
        assert error["details"].startswith(f"{key}=")


# ---- host paths -------------------------------------------------------------------------


def _ipam_nad(node: Node, name: str, **ipam: Any) -> None:
    conf = node.macvlan_conf()
    conf["ipam"].update(ipam)
    node.nad(name, conf)


@pytest.mark.parametrize(
    ("ipam", "key"),
    [
        ({"dataDir": "/"}, "ipam.dataDir '/'"),  # with the NAD named dev: /dev/lock, devices
        ({"dataDir": "RELATIVE"}, "not an absolute path"),
        ({"dataDir": "ROOT/../../etc"}, "not a normalised path"),
        ({"resolvConf": "/etc/shadow"}, "ipam.resolvConf '/etc/shadow'"),
    ],
)
def test_ipam_host_paths_outside_the_allowed_roots_are_refused(
    node: Node, mode: Daemon | None, ipam: dict[str, Any], key: str
) -> None:
    ipam = {k: v.replace("ROOT", str(node.root)) for k, v in ipam.items()}
    _ipam_nad(node, "dev", **ipam)
    node.pod("t", "dev")
    _refused(node, key, node.pod_netns())
    assert not Path("/dev/lock").exists()
    _serves_the_next_pod(node)


def test_an_sriov_data_dir_and_a_symlink_out_of_the_roots_are_refused(
    node: Node, mode: Daemon | None
) -> None:
    (node.root / "escape").symlink_to("/etc")
    node.nad("vf", {"cniVersion": "1.0.0", "type": "sriov", "dataDir": "/etc/cron.d"})
    node.pod("t", "vf")
    _refused(node, "sriov dataDir '/etc/cron.d'", node.pod_netns())
    _ipam_nad(node, "link", dataDir=str(node.root / "escape"))
    node.pod("u", "link")
    _refused(node, "symlinks are followed", node.pod_netns(), pod="u")


def test_system_namespace_nads_may_name_host_paths_only_when_the_admin_trusts_them(
    node: Node,
) -> None:
    outside = Path("/var/tmp") / f"plexus-trust-{node.tag}"
    conf = node.macvlan_conf()
    conf["ipam"]["dataDir"] = str(outside)
    node.nad("infra", conf, namespace="kube-system")
    node.pod("t", "kube-system/infra")
    try:
        _refused(node, "is refused", node.pod_netns())
        with running(node, trustSystemNamespaces=True):
            netns = node.pod_netns()
            node.ok(
                "ADD", netns=netns, cid="c-t", pod="t", conf=node.meta(trustSystemNamespaces=True)
            )
            assert node.links(netns) == ["eth0", "lo", "net1"]
            assert any(outside.rglob("10.98.*"))
    finally:
        shutil.rmtree(outside, ignore_errors=True)


# ---- devices belong to their pod ------------------------------------------------------

SRIOV = "intel.com/sriov_t"


def _vf_nad(node: Node, name: str) -> None:
    config = {"cniVersion": "1.0.0", "type": "marker"}
    node.nad(name, config, annotations={RESOURCE_NAME_ANNOTATION: SRIOV})


@pytest.mark.parametrize(
    ("device", "words"),
    [
        ("0000:3b:02.7", "deviceID 0000:3b:02.7 is not one of the intel.com/sriov_t devices"),
        ("../../sys/bus/pci", "is neither a PCI address"),
    ],
)
def test_a_pod_may_name_only_a_device_it_was_allocated(node: Node, device: str, words: str) -> None:
    sock = node.root / "kubelet.sock"
    marks = _install_marker(node)
    _vf_nad(node, "vf")
    node.pod("t", [{"name": "vf", "deviceID": device}])
    conf = node.meta(podResourcesSocket=str(sock))
    with serve(sock, {("default", "t"): {"app": {SRIOV: ["0000:3b:02.1"]}}}):
        _refused(node, words, node.pod_netns(), conf=conf)
    assert not marks.exists()


# ---- GC forgets what nothing uses -------------------------------------------------------


def test_gc_forgets_a_range_once_no_record_or_lease_uses_it(node: Node) -> None:
    node.nad("gone-net", node.macvlan_conf(subnet="10.95.0.0/16"))
    node.pod("t", "gone-net")
    netns = node.pod_netns()
    node.ok("ADD", netns=netns, cid="c-t", pod="t")
    ledger = node.cni_dir / "ranges"
    assert len(list(ledger.iterdir())) == 2  # the default network's and gone-net's
    node.ok("DEL", netns=netns, cid="c-t", pod="t")
    node.added.clear()
    node.remove("nad-default-gone-net.yaml")

    node.ok("GC", conf=node.meta(**{"cni.dev/valid-attachments": []}))

    noted = [json.loads(p.read_text())["network"] for p in ledger.iterdir()]
    assert noted == ["default-net"]  # still configured as the meta config's delegate
    wait_for(lambda: "range no longer used, forgotten" in _log(node), "the log line")


def _log(node: Node) -> str:
    path = node.root / "plexus.log"
    return path.read_text() if path.exists() else ""
