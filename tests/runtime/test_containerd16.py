"""The smoke test still run on Debian's containerd 1.6 (what Debian 12 ships): a pod's
sandbox attached through the shim and the daemon, then released without a trace.

The rest of the tier runs on containerd 2.x; the two-node tier keeps a 1.6 node as well.
1.6's libcni reads the conflist at cniVersion 1.0.0 (it cannot parse a 1.1.0 result).
"""

from __future__ import annotations

import pytest

from tests.netns.daemon import Daemon
from tests.runtime.conftest import Pods, Runtime
from tests.runtime.test_cri import NAD, SECONDARY_SUBNET, check_attached, check_released

pytestmark = pytest.mark.runtime


def test_pod_on_containerd_16_attaches_and_releases(runtime_debian: Runtime) -> None:
    rt = runtime_debian
    rt.node.nad(NAD, rt.node.macvlan_conf(SECONDARY_SUBNET))
    daemon = Daemon(rt.node)
    daemon.start()
    pods = Pods(rt)
    try:
        before = rt.snapshot()
        pods.create("smoke", NAD)
        attached = check_attached(rt, "smoke", pods.run("smoke"))
        assert daemon.metric("plexus_requests_total", verb="ADD", result="ok") == 1
        pods.stop_and_remove("smoke")
        before["node links"] = sorted({*before["node links"], "pxbr0"})  # the bridge stays
        check_released(rt, before, [attached])
    finally:
        pods.close()
        daemon.stop()
