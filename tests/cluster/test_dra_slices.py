"""The DRA plugin's ResourceSlice publisher (deviceplugin/dra/publish.py) against the real
kube-apiserver: pools published, a changed pool re-published at a higher generation, a
deleted slice put back, a dropped pool's slice removed, and nothing written when the API
already agrees; and all of it, plus a claim's GET, with no more rights than the device
plugin's ServiceAccount gets from crds/plexus-deviceplugin.yaml. The VFs come from a FAKE
sysfs (the host has no SR-IOV)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.dra.prepare import ClaimRef, PrepareError, Preparer
from deviceplugin.dra.publish import SlicePublisher
from deviceplugin.dra.state import PreparedState
from deviceplugin.sysfs import PciNetDevice, discover
from kube.api import APIError, KubeAPI
from tests.cluster import sriov
from tests.cluster.apiserver import REPO, ApiError, Cluster
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
RESOURCE = "intel.com/pub_vfs"
OTHER = "intel.com/other_vfs"
TIMEOUT = 30.0

Json = dict[str, Any]


@pytest.fixture
def node(cluster: Cluster) -> Iterator[str]:
    name = f"pxt-dra-{uuid.uuid4().hex[:8]}"
    cluster.create("/api/v1/nodes", {"metadata": {"name": name}})
    try:
        yield name
    finally:
        cluster.request("DELETE", f"/api/v1/nodes/{name}")
        for s in slices(cluster, name):
            try:
                cluster.request("DELETE", f"{SLICES}/{s['metadata']['name']}")
            except ApiError as err:  # the garbage collector may follow the node's first
                if err.status != 404:
                    raise


@pytest.fixture
def vfs(tmp_path: Path) -> list[PciNetDevice]:
    sysfs = FakeSysfs(tmp_path / "sys")
    sysfs.add_pf("0000:3b:00.0", "ens1f0")
    for i in range(3):
        sysfs.add_vf("0000:3b:00.0", i, f"0000:3b:02.{i}", netdev=f"ens1f0v{i}")
    return [d for d in discover(sysfs.root) if d.is_vf]


def slices(cluster: Cluster, node: str) -> list[Json]:
    items: list[Json] = cluster.get(SLICES, query={"fieldSelector": f"spec.nodeName={node}"})[
        "items"
    ]
    return items


def until(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert time.monotonic() < deadline, f"waited {TIMEOUT:.0f} s for {what}"
        time.sleep(0.1)


def devices_by_pool(cluster: Cluster, node: str) -> dict[str, tuple[int, list[str]]]:
    return {
        s["spec"]["pool"]["name"]: (
            s["spec"]["pool"]["generation"],
            [d["name"] for d in s["spec"].get("devices") or []],
        )
        for s in slices(cluster, node)
    }


def shipped_rbac_kubeconfig(cluster: Cluster, path: Path) -> Path:
    """The shipped RBAC applied, and a kubeconfig whose user is the device plugin's
    ServiceAccount (a client certificate with its username: RBAC matches by name)."""
    cluster.create_namespace("kube-system")
    manifests = yaml.safe_load_all((REPO / "crds/plexus-deviceplugin.yaml").read_text())
    for doc in manifests:
        if doc["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
            cluster.apply(doc)
    return sriov.service_account_kubeconfig(cluster, path)


@pytest.mark.parametrize("identity", ["admin", "service-account"])
def test_publisher_follows_the_pools_and_puts_back_what_others_delete(
    cluster: Cluster, node: str, vfs: list[PciNetDevice], identity: str, tmp_path: Path
) -> None:
    kubeconfig = cluster.kubeconfig
    if identity == "service-account":
        kubeconfig = shipped_rbac_kubeconfig(cluster, tmp_path / "kubeconfig")
    publisher = SlicePublisher(KubeAPI(str(kubeconfig)), node, resync_seconds=3600)
    pool, other = f"{node}/intel.com/pub-vfs", f"{node}/intel.com/other-vfs"
    publisher.set_pools({RESOURCE: vfs, OTHER: []})
    publisher.start()
    try:
        names = ["vf-0000-3b-02-0", "vf-0000-3b-02-1", "vf-0000-3b-02-2"]
        until(
            "both pools",
            lambda: devices_by_pool(cluster, node) == {pool: (1, names), other: (1, [])},
        )
        assert publisher.reconcile() == 0  # the API's copy counts as current: no writes

        publisher.set_pools({RESOURCE: vfs[:2], OTHER: []})  # a VF went away
        until("the smaller pool", lambda: devices_by_pool(cluster, node)[pool] == (2, names[:2]))

        (gone,) = [s for s in slices(cluster, node) if s["spec"]["pool"]["name"] == other]
        cluster.request("DELETE", f"{SLICES}/{gone['metadata']['name']}")  # as the kubelet does
        until(
            "the deleted slice back",
            lambda: (
                other in devices_by_pool(cluster, node)
                and devices_by_pool(cluster, node)[other][1] == []
            ),
        )
        assert devices_by_pool(cluster, node)[pool] == (2, names[:2])  # left alone

        publisher.set_pools({RESOURCE: vfs[:2]})  # the resource left the config
        until("the dropped pool's slice gone", lambda: other not in devices_by_pool(cluster, node))
    finally:
        publisher.stop()


def test_the_service_account_may_get_claims_and_nothing_more(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    api = KubeAPI(str(shipped_rbac_kubeconfig(cluster, tmp_path / "kubeconfig")))
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    spec = {"devices": {"requests": [{"name": "vf", "exactly": {"deviceClassName": "x"}}]}}
    claim = cluster.create(claims, {"metadata": {"name": "c"}, "spec": spec})
    preparer = Preparer(api, PreparedState(tmp_path / "state"), tmp_path / "cdi", tmp_path)
    # The GET is allowed: the claim is read, and refused only for not being allocated.
    with pytest.raises(PrepareError, match=r"claim .*/c: not allocated"):
        preparer.prepare(ClaimRef(namespace, claim["metadata"]["uid"], "c"))
    with pytest.raises(APIError) as denied:
        api.request("GET", claims)
    assert denied.value.status == 403
