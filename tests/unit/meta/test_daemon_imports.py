"""What the node daemon loads at start: nothing only /metrics or an in-process delegate
needs (docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys

# Loaded only by the HTTP server for /healthz, /readyz and /metrics, or by a scrape.
SERVING_ONLY = ("asyncio", "prometheus_client.exposition", "http.server", "wsgiref")
# Loaded by the first in-process delegate (or default-route change): netlink and IPAM.
DELEGATES_ONLY = ("pyroute2", "delegates.rtnl", "delegates.link", "delegates.ipam.host_local")


def _modules_after(code: str) -> set[str]:
    """sys.modules of a fresh interpreter after running `code`."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_daemon_without_a_metrics_port_loads_no_http_server() -> None:
    loaded = _modules_after(
        "import meta.daemon.main\nfrom meta.daemon.metrics import Metrics\nMetrics()"
    )

    assert "meta.daemon.main" in loaded
    assert loaded.isdisjoint(SERVING_ONLY)


def test_the_daemon_loads_netlink_and_in_process_ipam_with_their_first_use() -> None:
    loaded = _modules_after("import meta.daemon.main\nimport meta.engine")

    assert "meta.engine" in loaded
    assert loaded.isdisjoint(DELEGATES_ONLY)

    # The names are real: the macvlan plugin and its IPAM load them all.
    assert set(DELEGATES_ONLY) <= _modules_after(
        "import delegates.macvlan, delegates.ipam.dispatch"
    )


def test_the_daemon_talks_to_the_api_server_without_urllib3() -> None:
    """kube/api.py is on http.client: urllib3 would cost ~0.6 ms a request."""
    loaded = _modules_after("import meta.daemon.main\nimport meta.sources.kube")

    assert "kube.api" in loaded
    assert not any(name.split(".")[0] == "urllib3" for name in loaded)


def test_the_cni_daemon_loads_nothing_of_the_device_plugin() -> None:
    """The device plugin, DRA driver and provisioning agent run in their own process:
    their modules in the CNI daemon are memory for nothing (its idle RSS is a bar)."""
    loaded = _modules_after(
        "import meta.daemon.main\nimport meta.engine\nimport meta.sources.kube\n"
        "import meta.podresources.client"
    )

    assert "meta.podresources.client" in loaded
    assert not any(name.split(".")[0] == "deviceplugin" for name in loaded)
