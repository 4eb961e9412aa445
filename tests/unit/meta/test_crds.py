"""The shipped manifests (crds/, a kustomize base; its overlays render in
tests/cluster/test_kustomize.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from meta.daemon.config import DaemonConfig

ROOT = Path(__file__).resolve().parents[3]
CRDS = sorted(p for p in (ROOT / "crds").rglob("*.yaml") if p.name != "kustomization.yaml")


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _shipped() -> list[dict[str, Any]]:
    return [d for f in CRDS for d in _docs(f.read_text())]


def _find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = (d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
    return doc


def _daemon_config(docs: list[dict[str, Any]], name: str = "plexus-daemon-config") -> Any:
    return json.loads(_find(docs, "ConfigMap", name)["data"]["daemon-config.json"])


def test_daemonset_installs_the_shim_only_and_chroots_delegates_into_the_host() -> None:
    docs = _shipped()
    spec = _find(docs, "DaemonSet", "plexus")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["command"][:3] == ["plexus", "install-cni", "--shim-only"]
    (daemon,) = spec["containers"]
    hostroot = next(m for m in daemon["volumeMounts"] if m["mountPath"] == "/hostroot")
    assert hostroot["mountPropagation"] == "HostToContainer"  # pods' netns mounts appear
    volume = next(v for v in spec["volumes"] if v["name"] == hostroot["name"])
    assert volume["hostPath"]["path"] == "/"
    conf = DaemonConfig.model_validate(_daemon_config(docs))
    assert conf.chroot_dir == "/hostroot" and conf.cluster_network == ""  # primary found itself
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "DaemonSet"]
    policies = {
        c["imagePullPolicy"] for p in pods for c in p.get("initContainers", []) + p["containers"]
    }
    assert policies == {"IfNotPresent"}
