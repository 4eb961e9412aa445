"""NetworkReady on a mixed cluster with Plexus installed from crds/.

The daemon's conflist offers `cniVersions` [1.0.0, 1.1.0]: containerd 2.x (libcni 1.3)
reads 1.1.0 and asks Plexus STATUS at every kubelet poll, so the node's network is ready
exactly when its daemon is; Debian's 1.6 reads `cniVersion` 1.0.0 and never asks. With
the daemon gone from the 2.x node (the DaemonSet kept off it), that node turns NotReady,
naming Plexus, and Ready again once its daemon is back; the 1.6 node stays Ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from meta.daemon.config import NETWORK_NAME
from tests.cluster import install
from tests.cluster.kubelet import KubeletNode
from tests.cluster.twonodes import TwoNodes
from tests.runtime import containerd as ctrd

pytestmark = pytest.mark.timeout(900)

WINDOW_TIMEOUT = 240.0  # a daemon pod deleted or started (a rollout on a loaded machine)


def _loaded_version(kn: KubeletNode) -> str:
    """The cniVersion the node's containerd runs Plexus's network at."""
    return str(kn.containerd.cni_network(NETWORK_NAME).get("CNIVersion", ""))


def _ready(kn: KubeletNode) -> tuple[bool, str]:
    condition = kn.conditions().get("Ready", {})
    return condition.get("status") == "True", str(condition.get("message", ""))


def _poll(tn: TwoNodes, what: str, done: Callable[[], bool]) -> None:
    """Call done() until true; meanwhile the 1.6 node must stay Ready."""
    deadline = time.monotonic() + WINDOW_TIMEOUT
    while not done():
        ready, message = _ready(tn.nodes[1])
        assert ready, f"the containerd 1.6 node turned NotReady: {message}"
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WINDOW_TIMEOUT:.0f} s for {what}\n{tn.dump()}")
        time.sleep(0.5)


def test_the_daemon_decides_network_ready_on_containerd_2(two_nodes: TwoNodes) -> None:
    tn = two_nodes
    if not tn.image:
        pytest.skip("Plexus is started by hand here: this tree cannot build its image")
    new, old = tn.nodes
    assert (new.containerd.release, old.containerd.release) == (ctrd.BUILT, ctrd.DEBIAN)
    assert (_loaded_version(new), _loaded_version(old)) == ("1.1.0", "1.0.0")
    assert _ready(new)[0] and _ready(old)[0]

    path = f"{install.DAEMONSETS}/plexus"
    off_new = {"nodeSelector": {"kubernetes.io/hostname": old.name}}
    tn.cluster.merge_patch(path, {"spec": {"template": {"spec": off_new}}})
    try:
        seen: list[str] = []

        def not_ready() -> bool:
            ready, message = _ready(new)
            if not ready:
                seen.append(message)
            return not ready

        _poll(tn, "the 2.x node NotReady without its daemon", not_ready)
        assert "NetworkPluginNotReady" in seen[0] and "plexus" in seen[0], seen[0]
    finally:
        tn.cluster.merge_patch(path, {"spec": {"template": {"spec": {"nodeSelector": None}}}})
    _poll(
        tn,
        "the daemons back on both nodes",
        lambda: install.daemonset_ready(tn.cluster, len(tn.nodes), tn.image),
    )
    _poll(tn, "the 2.x node Ready again", lambda: _ready(new)[0])
