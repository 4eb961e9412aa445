"""The control plane the cluster tier runs on: NAD CRD served, pods, the repo's manifests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.apiserver import NAD_GROUP_VERSION, REPO, ApiError, Cluster

NADS = f"/apis/{NAD_GROUP_VERSION}/namespaces/{{ns}}/network-attachment-definitions"
MANIFESTS = sorted(p for p in (REPO / "crds").rglob("*.yaml") if p.name != "kustomization.yaml")


def _manifest_docs() -> list[Any]:
    """Every document under crds/, CRDs first so the objects they define can follow."""
    params = []
    for path in MANIFESTS:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for i, doc in enumerate(docs):
            rel = path.relative_to(REPO).as_posix()
            order = 0 if doc["kind"] == "CustomResourceDefinition" else 1
            params.append((order, pytest.param(doc, id=f"{rel}#{i}")))
    return [p for _, p in sorted(params, key=lambda t: t[0])]


def test_nad_round_trip_preserves_config(cluster: Cluster, namespace: str) -> None:
    # A conflist with the formatting a user would write: indentation, a non-ASCII
    # character and a trailing newline must all survive byte for byte.
    config = (
        '{\n  "cniVersion": "1.0.0",\n  "name": "data-net",\n  "plugins": [\n'
        '    {"type": "macvlan", "master": "eth1", "mode": "bridge",\n'
        '     "ipam": {"type": "static", "addresses": [{"address": "192.0.2.10/24"}]}},\n'
        '    {"type": "tuning", "sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "1"}}\n'
        '  ],\n  "description": "Réseau de données"\n}\n'
    )
    nad = {
        "apiVersion": NAD_GROUP_VERSION,
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "data-net"},
        "spec": {"config": config},
    }
    cluster.create(NADS.format(ns=namespace), nad)
    got = cluster.get(f"{NADS.format(ns=namespace)}/data-net")
    assert got["spec"]["config"] == config
    json.loads(got["spec"]["config"])
    listed = cluster.get(NADS.format(ns=namespace))
    assert [i["metadata"]["name"] for i in listed["items"]] == ["data-net"]


def test_nad_schema_rejects_non_string_config(cluster: Cluster, namespace: str) -> None:
    nad = {
        "apiVersion": NAD_GROUP_VERSION,
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": "bad"},
        "spec": {"config": {"type": "macvlan"}},
    }
    with pytest.raises(ApiError) as err:
        cluster.create(NADS.format(ns=namespace), nad)
    assert err.value.status == 422
    assert "spec.config" in err.value.body


def test_nad_discovery_has_short_name(cluster: Cluster) -> None:
    res = cluster.find_resource(NAD_GROUP_VERSION, "network-attachment-definitions")
    assert res["kind"] == "NetworkAttachmentDefinition"
    assert res["namespaced"] is True
    assert res["shortNames"] == ["net-attach-def"]
    assert res["singularName"] == "network-attachment-definition"


def test_pod_stays_pending_and_annotations_patch(cluster: Cluster, namespace: str) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    networks = "k8s.v1.cni.cncf.io/networks"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "two-nets", "annotations": {networks: "data-net@data0"}},
        "spec": {
            "nodeName": "plexus-node-0",  # bound directly: there is no scheduler
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    created = cluster.create(pods, pod)
    assert created["spec"]["nodeName"] == "plexus-node-0"
    assert created["status"]["phase"] == "Pending"

    status = [{"name": "default/data-net", "interface": "data0", "ips": ["192.0.2.10"]}]
    status_key = "k8s.v1.cni.cncf.io/network-status"
    patched = cluster.merge_patch(
        f"{pods}/two-nets", {"metadata": {"annotations": {status_key: json.dumps(status)}}}
    )
    annotations = patched["metadata"]["annotations"]
    assert annotations[networks] == "data-net@data0"
    assert json.loads(annotations[status_key]) == status

    got = cluster.get(f"{pods}/two-nets")
    assert got["metadata"]["annotations"] == annotations
    assert got["status"]["phase"] == "Pending"
    assert int(got["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])


@pytest.mark.parametrize("doc", _manifest_docs())
def test_manifest_server_side_dry_run_apply(cluster: Cluster, doc: dict[str, Any]) -> None:
    path = cluster.object_path(doc)
    existed = _exists(cluster, path)
    applied = cluster.apply(doc, dry_run=True, manager="plexus-dry-run")
    assert applied["kind"] == doc["kind"]
    assert applied["metadata"]["name"] == doc["metadata"]["name"]
    assert _exists(cluster, path) == existed  # a dry run persists nothing


def test_manifests_found() -> None:
    assert Path(REPO / "crds" / "network-attachment-definition.yaml") in MANIFESTS


def test_kubeconfig_drives_the_kubernetes_client(cluster: Cluster, namespace: str) -> None:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster.kubeconfig), client_configuration=configuration
    )
    with client.ApiClient(configuration) as api:
        meta = client.CoreV1Api(api).read_namespace(namespace).metadata
        assert meta is not None and meta.name == namespace
        group, version = NAD_GROUP_VERSION.split("/")
        nads = client.CustomObjectsApi(api).list_namespaced_custom_object(
            group, version, namespace, "network-attachment-definitions"
        )
        assert isinstance(nads, dict) and nads["items"] == []


def _exists(cluster: Cluster, path: str) -> bool:
    try:
        cluster.get(path)
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return True
