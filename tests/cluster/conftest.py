"""Fixtures for the cluster tier: one etcd + kube-apiserver per test session.

The control plane starts lazily, on the first test that asks for `cluster`, and the tier
skips when scripts/build-go-tools.sh has not built the binaries. `kubelet_node` adds a
real node to it (tests/cluster/kubelet.py: kubelet + containerd + the Plexus daemon),
once per module that asks for it. `two_nodes` adds the controllers and two such nodes on a
shared L2 (tests/cluster/twonodes.py), once per session, with Plexus installed on both
(installed again for the next test when one has uninstalled it).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.cluster import kubelet, twonodes
from tests.cluster.apiserver import TOOLS, Cluster, missing_binaries
from tests.netns.conftest import node  # noqa: F401  (the daemon tests' node namespace)

_STARTUP_KEY = pytest.StashKey[float]()
_NODE_STARTUP_KEY = pytest.StashKey[float]()
_TWO_NODES_STARTUP_KEY = pytest.StashKey[float]()
_PLEXUS_INSTALL_KEY = pytest.StashKey[float]()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A running control plane with the NAD CRD established; torn down after the session."""
    missing = missing_binaries()
    if missing:
        pytest.skip(f"{', '.join(missing)} not built in {TOOLS} (run make setup)")
    with Cluster.running() as running:
        request.config.stash[_STARTUP_KEY] = running.startup_seconds
        yield running


def _require(missing: list[str]) -> None:
    if missing:
        pytest.skip(f"{', '.join(missing)} missing (run make setup)")


@pytest.fixture(scope="module")
def kubelet_node(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[kubelet.KubeletNode]:
    """A Ready node of `cluster`: a real kubelet on containerd with Plexus as its CNI."""
    _require(kubelet.missing_binaries())
    kn = kubelet.KubeletNode(cluster)
    try:
        kn.start()
        request.config.stash[_NODE_STARTUP_KEY] = kn.startup_seconds
        yield kn
    finally:
        kn.close()


@pytest.fixture(scope="session")
def two_nodes_session(
    request: pytest.FixtureRequest, cluster: Cluster
) -> Iterator[twonodes.TwoNodes]:
    """Controllers plus two Ready nodes on one LAN, Plexus installed on both."""
    _require(twonodes.missing_binaries())
    nodes = twonodes.TwoNodes(cluster)
    try:
        nodes.start()
        nodes.install_plexus()
        request.config.stash[_TWO_NODES_STARTUP_KEY] = nodes.startup_seconds
        request.config.stash[_PLEXUS_INSTALL_KEY] = nodes.install_seconds
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def two_nodes(two_nodes_session: twonodes.TwoNodes) -> twonodes.TwoNodes:
    """The session's two nodes with Plexus on them (again, if a test uninstalled it)."""
    two_nodes_session.ensure_plexus()
    return two_nodes_session


@pytest.fixture
def namespace(cluster: Cluster) -> str:
    """A fresh namespace (with its `default` ServiceAccount) for one test."""
    name = f"pxt-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(name)
    return name


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for key, what in (
        (_STARTUP_KEY, "etcd + kube-apiserver ready with the NAD CRD"),
        (_NODE_STARTUP_KEY, "kubelet node (containerd + plexus daemon) Ready"),
        (_TWO_NODES_STARTUP_KEY, "controllers + two kubelet nodes on one LAN Ready"),
        (_PLEXUS_INSTALL_KEY, "Plexus installed on both nodes"),
    ):
        seconds = terminalreporter.config.stash.get(key, None)
        if seconds is not None:
            terminalreporter.write_line(f"cluster tier: {what} in {seconds:.1f} s")
