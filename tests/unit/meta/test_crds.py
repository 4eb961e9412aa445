"""The shipped manifests (crds/) and scripts/overlay-crds.py, which tests apply them through."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from meta.daemon.config import DaemonConfig

ROOT = Path(__file__).resolve().parents[3]
CRDS = sorted((ROOT / "crds").glob("*.yaml"))


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


def test_overlay_changes_only_image_host_paths_config_and_node() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/overlay-crds.py"),
            "--image=localhost/plexus:t2",
            "--host-path=/opt/cni/bin=/tmp/n1/bin",
            "--host-path=/etc/cni/net.d=/tmp/n1/net.d",
            '--config=socketDir="/run/plexus-n1"',
            "--node=n1",
            *map(str, CRDS),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    docs = _docs(out)
    assert len(docs) == len(_shipped())
    ds = _find(docs, "DaemonSet", "plexus-n1")["spec"]["template"]["spec"]
    assert {c["image"] for c in ds["initContainers"] + ds["containers"]} == {"localhost/plexus:t2"}
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in ds["volumes"]}
    assert paths["cni-bin"] == "/tmp/n1/bin" and paths["cni-conf"] == "/tmp/n1/net.d"
    assert paths["hostroot"] == "/"  # what the test did not name stays as shipped
    assert ds["nodeSelector"]["kubernetes.io/hostname"] == "n1"
    config_volume = next(v for v in ds["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"] == "plexus-daemon-config-n1"
    conf = _daemon_config(docs, "plexus-daemon-config-n1")
    assert conf["socketDir"] == "/run/plexus-n1" and conf["chrootDir"] == "/hostroot"
    assert _find(docs, "ClusterRole", "plexus") == _find(_shipped(), "ClusterRole", "plexus")
