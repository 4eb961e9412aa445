"""CNI 1.1 as containerd 2.x speaks it to Plexus: STATUS, the chained subdirectory, GC.

containerd 2.x (libcni 1.3, go-cni 1.1) reads the tier's conflist at cniVersion 1.1.0 and
runs CNI STATUS on every CRI Status call, the kubelet's NetworkReady: the default network
decides it, a secondary network's problem never flips it, and the daemon's restart window
shows as NotReady until it serves again. It chains `<conf_dir>/<network name>/*.conf`
after Plexus by itself. It sends neither CHECK nor GC (v2.4.2 and go-cni v1.1.14 never
call libcni's CheckNetworkList or GCNetworkList), so GC as libcni 1.3 would send it, with
`cni.dev/valid-attachments` from the runtime's own sandbox list, is `plexus cni gc`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as cri

from cni.fileio import write_atomic
from tests.netns.daemon import PLEXUS, Daemon
from tests.runtime import containerd as ctrd
from tests.runtime.conftest import LIBCNI_CACHE, Pods, Runtime, in_netns
from tests.runtime.test_cri import NAD, SECONDARY_SUBNET, check_attached, check_released

pytestmark = pytest.mark.runtime

SYSCTL = "net.ipv4.conf.eth0.arp_filter"
WAIT = 90.0  # a config reload or the daemon's restart, on a loaded machine
Json = dict[str, Any]


@pytest.fixture(autouse=True)
def macvlan_nad(runtime: Runtime) -> None:
    runtime.node.nad(NAD, runtime.node.macvlan_conf(SECONDARY_SUBNET))


def _wait(what: str, probe: Callable[[], Any], timeout: float = WAIT) -> Any:
    """probe()'s first truthy value; fails naming `what` and the last value after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}; last: {value!r}"
        time.sleep(0.2)


def network_ready(rt: Runtime) -> cri.RuntimeCondition:
    """The NetworkReady condition of one CRI Status call (one CNI STATUS on 2.x)."""
    done: cri.StatusResponse = rt.containerd.runtime.Status(
        cri.StatusRequest(), timeout=ctrd.CRI_TIMEOUT
    )
    (condition,) = [c for c in done.status.conditions if c.type == "NetworkReady"]
    return condition


def loaded(rt: Runtime) -> Json:
    """The tier's network as containerd loaded it: its source text and plugin types."""
    net = rt.containerd.cni_network(rt.network)
    if not net:
        return {}
    return {"source": net["Source"], "plugins": [p["Network"]["type"] for p in net["Plugins"]]}


@contextlib.contextmanager
def conflist(rt: Runtime, plexus: Json) -> Iterator[None]:
    """The tier's conflist with `plexus` as its plugin, loaded by containerd; put back after."""
    path = rt.containerd.conf_dir / "10-plexus.conflist"
    original = path.read_bytes()
    text = json.dumps({**json.loads(original), "plugins": [plexus]})
    write_atomic(path, text.encode(), 0o644)
    try:
        _wait("containerd to load the new conflist", lambda: loaded(rt)["source"] == text)
        yield
    finally:
        write_atomic(path, original, 0o644)
        _wait(
            "containerd to load the tier's conflist",
            lambda: loaded(rt)["source"] == original.decode(),
        )


def _status_lines(rt: Runtime) -> list[Json]:
    log = rt.node.root / "plexus.log"
    return [
        line
        for line in map(json.loads, log.read_text().splitlines())
        if line.get("verb") == "status"
    ]


def test_every_cri_status_is_a_cni_status_answered_by_the_daemon(
    runtime: Runtime, pods: Pods, daemon: Daemon
) -> None:
    before = daemon.metric("plexus_requests_total", verb="STATUS", result="ok")
    for _ in range(3):
        assert network_ready(runtime).status
    assert daemon.metric("plexus_requests_total", verb="STATUS", result="ok") == before + 3

    # ADD and DEL at the list's 1.1.0: containerd caches Plexus's result at that version.
    pods.create("versioned", NAD)
    sandbox_id = pods.run("versioned")
    check_attached(runtime, "versioned", sandbox_id)
    cached = json.loads(
        (LIBCNI_CACHE / "results" / f"{runtime.network}-{sandbox_id}-eth0").read_text()
    )
    assert cached["kind"] == "cniCacheV1" and cached["result"]["cniVersion"] == "1.1.0"
    assert json.loads(base64.b64decode(cached["config"]))["cniVersion"] == "1.1.0"


def test_a_secondary_network_s_problem_never_flips_network_ready(runtime: Runtime) -> None:
    """Thin mode (no daemon): the stdin conflist alone decides the static networks."""
    node = runtime.node
    broken = {"cniVersion": "1.1.0", "name": "vendor-net", "type": "no-such-plugin"}
    with conflist(runtime, node.meta(delegates=[node.bridge_conf(), broken])):
        for _ in range(3):
            assert network_ready(runtime).status
        warned = [
            line
            for line in _status_lines(runtime)
            if line.get("network") == "vendor-net" and "node stays Ready" in line.get("msg", "")
        ]
        assert len(warned) >= 3, "STATUS never reached the broken secondary network"


def test_the_default_network_decides_network_ready(runtime: Runtime) -> None:
    node = runtime.node
    broken = {"cniVersion": "1.1.0", "name": "primary-net", "type": "no-such-plugin"}
    with conflist(runtime, node.meta(delegates=[broken, node.bridge_conf()])):
        condition = network_ready(runtime)
        assert not condition.status
        assert condition.reason == "NetworkPluginNotReady"
        assert 'failed to find plugin "no-such-plugin"' in condition.message
    assert network_ready(runtime).status


def test_the_daemon_s_restart_window_is_not_ready_and_recovers(
    runtime: Runtime, daemon: Daemon
) -> None:
    """As a DaemonSet installs it: the shim alone in bin_dir, no plexus-thin to fall back on."""
    thin = runtime.node.bin / "plexus-thin"
    hidden = runtime.node.bin / ".plexus-thin.hidden"
    thin.rename(hidden)
    try:
        assert network_ready(runtime).status
        daemon.stop()

        def not_ready() -> cri.RuntimeCondition | None:
            condition = network_ready(runtime)
            return None if condition.status else condition

        down = _wait("NetworkReady false", not_ready)
        assert down.reason == "NetworkPluginNotReady" and "daemon" in down.message
        daemon.start()
        _wait("NetworkReady again", lambda: network_ready(runtime).status)
    finally:
        hidden.rename(thin)


@pytest.fixture
def newer_tuning(runtime: Runtime) -> Iterator[None]:
    """The reference tuning plugin that reads cniVersion 1.1.0 in the tier's bin_dir
    (Debian's 1.1.1 stops at 1.0.0), Debian's back after."""
    built = ctrd.GO_TOOLS / "tuning"
    assert os.access(built, os.X_OK), f"{built} not built (run make setup)"
    link = runtime.node.bin / "tuning"
    debian = os.readlink(link)
    link.unlink()
    link.symlink_to(built)
    try:
        yield
    finally:
        link.unlink()
        link.symlink_to(debian)


def test_plugins_chained_onto_plexus_s_network_by_the_runtime(
    runtime: Runtime, pods: Pods, daemon: Daemon, newer_tuning: None
) -> None:
    """`<conf_dir>/<network>/50-tuning.conf`: containerd runs tuning after Plexus on eth0,
    with Plexus's result as prevResult, and STATUS through both. containerd 2.4 reloads on
    a write, rename or removal in conf_dir only (a new entry's event is ignored, the
    subdirectory is not watched): the conflist is rewritten for it, as an admin must."""
    chain = runtime.containerd.conf_dir / runtime.network
    chain.mkdir()
    (chain / "50-tuning.conf").write_text(json.dumps({"type": "tuning", "sysctl": {SYSCTL: "1"}}))
    try:
        _reload(runtime)
        _wait(
            "containerd to chain tuning", lambda: loaded(runtime)["plugins"] == ["plexus", "tuning"]
        )
        assert network_ready(runtime).status
        before = runtime.snapshot()
        pods.create("tuned", NAD)
        attached = check_attached(runtime, "tuned", pods.run("tuned"))
        assert in_netns(attached.netns, "sysctl", "-n", SYSCTL).strip() == "1"
        pods.stop_and_remove("tuned")
        before["node links"] = sorted({*before["node links"], "pxbr0"})  # the bridge stays
        check_released(runtime, before, [attached])
    finally:
        shutil.rmtree(chain)
        _reload(runtime)
        _wait("containerd to drop tuning", lambda: loaded(runtime)["plugins"] == ["plexus"])


def _reload(rt: Runtime) -> None:
    """The conflist written again, unchanged: what makes containerd 2.x read conf_dir."""
    path = rt.containerd.conf_dir / "10-plexus.conflist"
    write_atomic(path, path.read_bytes(), 0o644)


def test_gc_with_the_runtime_s_sandboxes_deletes_only_what_it_lost(
    runtime: Runtime, pods: Pods, daemon: Daemon
) -> None:
    """A sandbox containerd lost (a crash between ADD and its own bookkeeping), left in
    libcni's cache and Plexus's record: `plexus cni gc` over the tier's conflist with
    valid-attachments from ListPodSandbox DELs it, and leaves the running pods alone."""
    node = runtime.node
    before = runtime.snapshot()
    pods.create("live", NAD)
    live = check_attached(runtime, "live", pods.run("live"))

    node.pod("lost", NAD)
    lost_netns = node.pod_netns()
    conf = runtime.containerd.conf_dir / "10-plexus.conflist"
    args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=lost;K8S_POD_UID=uid-lost"
    _plexus_cni(runtime, "add", "--conf", str(conf), "--netns", lost_netns,
                "--container-id", "lost-sandbox", "--args", args)  # fmt: skip
    assert node.links(lost_netns) == ["eth0", "lo", "net1"]
    assert "lost-sandbox" in runtime.records()
    assert f"{runtime.network}-lost-sandbox-eth0" in runtime.libcni_results()

    valid = [[sandbox_id, "eth0"] for sandbox_id in runtime.containerd.sandboxes()]
    assert valid == [[live.sandbox_id, "eth0"]]
    _plexus_cni(runtime, "gc", "--conf", str(conf), "--valid", json.dumps(valid))

    assert node.links(lost_netns) == ["lo"]
    assert "lost-sandbox" not in runtime.records()
    assert f"{runtime.network}-lost-sandbox-eth0" not in runtime.libcni_results()
    assert served_gc(daemon) == 1
    assert check_attached(runtime, "live", live.sandbox_id) == live
    pods.stop_and_remove("live")
    check_released(runtime, before, [live])


def served_gc(daemon: Daemon) -> float:
    return daemon.metric("plexus_requests_total", verb="GC", result="ok")


def _plexus_cni(runtime: Runtime, verb: str, *options: str) -> str:
    """`plexus cni VERB` in the node netns, with the tier's bin_dir and containerd's cache."""
    command = [PLEXUS, "cni", verb, *options, "--path", str(runtime.node.bin)]
    command += ["--cache-dir", str(LIBCNI_CACHE)]
    done = subprocess.run(
        ["ip", "netns", "exec", runtime.node.name, *command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"plexus cni {verb}: {done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout
