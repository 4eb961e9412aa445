"""crds/ as a kustomize base, rendered by the kubectl built with the cluster: the
documented overlays (overlays/) change only the image and the host paths they name, and
the overlay the tests install through (tests/cluster/install.py) does the same."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.cluster.apiserver import REPO
from tests.cluster.install import BASE, KUBECTL, SEPARATE, UNINSTALL_BASE, kubectl, overlay

Json = dict[str, Any]


@pytest.fixture(autouse=True)
def _kubectl() -> None:
    if not KUBECTL.exists():
        pytest.skip(f"{KUBECTL} not built (run make setup)")


def _render(directory: Any) -> list[Json]:
    return [d for d in yaml.safe_load_all(kubectl(None, "kustomize", str(directory))) if d]


def _containers(doc: Json) -> list[Json]:
    spec = doc["spec"]["template"]["spec"]
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _host_paths(doc: Json) -> dict[str, str]:
    volumes = doc["spec"]["template"]["spec"].get("volumes", [])
    return {v["name"]: v["hostPath"]["path"] for v in volumes if "hostPath" in v}


def _without_images_and_host_paths(docs: list[Json]) -> list[Json]:
    out = copy.deepcopy(docs)
    for doc in out:
        if doc["kind"] == "DaemonSet":
            for container in _containers(doc):
                container["image"] = "-"
            spec = doc["spec"]["template"]["spec"]
            for volume in spec.get("volumes", []):
                if "hostPath" in volume:
                    volume["hostPath"]["path"] = "-"
            spec["volumes"] = sorted(spec.get("volumes", []), key=lambda v: v["name"])  # merged
    return out


def test_the_base_holds_every_object_of_its_manifests() -> None:
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    expected = sum(
        len([d for d in yaml.safe_load_all((BASE / f).read_text()) if d]) for f in listed
    )
    docs = _render(BASE)
    assert len(docs) == expected
    images = {c["image"] for d in docs if d["kind"] == "DaemonSet" for c in _containers(d)}
    assert images == {"plexus:dev"}


def test_the_example_overlay_sets_the_image_and_the_host_path_only() -> None:
    base, example = _render(BASE), _render(REPO / "overlays" / "example")
    assert _without_images_and_host_paths(example) == _without_images_and_host_paths(base)
    daemonsets = [d for d in example if d["kind"] == "DaemonSet"]
    assert {c["image"] for d in daemonsets for c in _containers(d)} == {
        "registry.example.com/plexus:0.1.0"
    }
    shipped = {_name(d): _host_paths(d) for d in base if d["kind"] == "DaemonSet"}
    for doc in daemonsets:
        before = shipped[_name(doc)]
        moved = {name: path for name, path in _host_paths(doc).items() if path != before[name]}
        assert moved == ({"cni-bin": "/home/kubernetes/bin"} if _name(doc) == "plexus" else {})


def test_the_example_uninstall_overlay_sets_the_image() -> None:
    (daemonset,) = _render(REPO / "overlays" / "example-uninstall")
    assert _name(daemonset) == "plexus-uninstall"
    assert {c["image"] for c in _containers(daemonset)} == {"registry.example.com/plexus:0.1.0"}
    assert _without_images_and_host_paths([daemonset]) == _without_images_and_host_paths(
        _render(UNINSTALL_BASE)
    )


def test_the_tests_overlay_moves_host_paths_and_leaves_out_what_it_is_told() -> None:
    with overlay(
        "localhost/plexus:t2", host_paths={"/opt/cni/bin": "/run/n1/bin"}, dropped=SEPARATE
    ) as directory:
        docs = _render(directory)
    left_out = [d for f in SEPARATE for d in yaml.safe_load_all(f.read_text()) if d]
    assert len(docs) == len(_render(BASE)) - len(left_out)
    assert not {(d["kind"], _name(d)) for d in docs} & {(d["kind"], _name(d)) for d in left_out}
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert {c["image"] for c in _containers(daemonset)} == {"localhost/plexus:t2"}
    assert _host_paths(daemonset)["cni-bin"] == "/run/n1/bin"
    assert _host_paths(daemonset)["hostroot"] == "/"  # what it did not name stays as shipped


def _name(doc: Json) -> str:
    return str(doc["metadata"]["name"])
