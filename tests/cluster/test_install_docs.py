"""The overlays docs/install.md shows, built by the cluster's kubectl (`kubectl kustomize`)
against crds/: they build, and they change what the page says they change."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.apiserver import binary
from tests.docs import ROOT, Block, blocks

KUBECTL = binary("kubectl")


def _overlays() -> list[tuple[str, Block]]:
    """(directory, block) of each `# DIR/kustomization.yaml` block of docs/install.md."""
    found = []
    for block in blocks([ROOT / "docs" / "install.md"]):
        first = block.text.splitlines()[0]
        if block.lang == "yaml" and first.endswith("/kustomization.yaml"):
            found.append((first.removeprefix("# ").removesuffix("/kustomization.yaml"), block))
    return found


def _build(directory: Path, block: Block) -> list[dict[str, Any]]:
    """kubectl kustomize of the overlay, its bases pointed at this checkout's crds/."""
    doc = yaml.safe_load(block.text)
    directory.mkdir()
    doc["resources"] = [  # kustomize takes bases only by relative path
        os.path.relpath(ROOT / "crds" / r.split("/crds", 1)[1].lstrip("/"), directory)
        for r in doc["resources"]
    ]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    assert os.access(KUBECTL, os.X_OK), f"{KUBECTL} is not built (run make setup)"
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.mark.parametrize(("name", "block"), _overlays(), ids=[n for n, _ in _overlays()])
def test_each_overlay_of_install_md_builds_with_what_it_sets(
    name: str, block: Block, tmp_path: Path
) -> None:
    overlay = yaml.safe_load(block.text)
    objects = _build(tmp_path / name, block)
    (image,) = overlay["images"]
    wanted = f"{image['newName']}:{image['newTag']}"
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet"]
    assert daemonsets
    for ds in daemonsets:
        spec = ds["spec"]["template"]["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            assert container["image"] == wanted, (ds["metadata"]["name"], container["name"])
    for patch in overlay.get("patches", []):
        target = yaml.safe_load(patch["patch"])
        (built,) = [o for o in daemonsets if o["metadata"]["name"] == target["metadata"]["name"]]
        volumes = {v["name"]: v for v in built["spec"]["template"]["spec"]["volumes"]}
        for volume in target["spec"]["template"]["spec"]["volumes"]:
            assert volumes[volume["name"]]["hostPath"]["path"] == volume["hostPath"]["path"]


def test_install_md_shows_the_install_and_the_uninstall_overlay() -> None:
    bases = sorted(
        r.split("/crds", 1)[1] for _, b in _overlays() for r in yaml.safe_load(b.text)["resources"]
    )
    assert bases == ["", "/uninstall"]
