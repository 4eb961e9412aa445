#!/usr/bin/env python3
"""Print crds/ manifests with the few values a test (or a user) must change, files untouched.

    scripts/overlay-crds.py [--image REF] [--host-path OLD=NEW]... [--config KEY=JSON]...
                            [--node NAME] FILE...

--image       every container image `plexus:dev` (the shipped reference) becomes REF
--host-path   every hostPath volume at OLD moves to NEW (e.g. a node's test CNI dirs)
--config      sets KEY of the daemon's daemon-config.json to the JSON value
--node        one copy per node: DaemonSets and ConfigMaps named `<name>-NAME`, pinned to
              the node `NAME` (nodes that share one filesystem need their own host paths)

The output is one multi-document YAML stream for `kubectl apply -f -` (or the API).
Run it with the venv's python (PyYAML).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

SHIPPED_IMAGE = "plexus:dev"
DAEMON_CONFIG = ("plexus-daemon-config", "daemon-config.json")


def overlay(
    docs: list[dict[str, Any]],
    image: str = "",
    host_paths: dict[str, str] | None = None,
    config: dict[str, Any] | None = None,
    node: str = "",
) -> list[dict[str, Any]]:
    """The manifests with the overlay applied (the input is not modified)."""
    out: list[dict[str, Any]] = json.loads(json.dumps(docs))
    per_node = [d for d in out if node and d["kind"] in ("ConfigMap", "DaemonSet")]
    renamed = {d["metadata"]["name"] for d in per_node}
    for doc in out:
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == DAEMON_CONFIG[0] and config:
            daemon = json.loads(doc["data"][DAEMON_CONFIG[1]]) | config
            doc["data"][DAEMON_CONFIG[1]] = json.dumps(daemon, indent=2)
        if doc["kind"] == "DaemonSet":
            _pod_spec(doc["spec"]["template"]["spec"], image, host_paths or {}, renamed, node)
    for doc in per_node:
        doc["metadata"]["name"] += f"-{node}"
    return out


def _pod_spec(
    spec: dict[str, Any], image: str, host_paths: dict[str, str], renamed: set[str], node: str
) -> None:
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        if image and container.get("image") == SHIPPED_IMAGE:
            container["image"] = image
    for volume in spec.get("volumes", []):
        path = volume.get("hostPath", {}).get("path")
        if path in host_paths:
            volume["hostPath"]["path"] = host_paths[path]
        ref = volume.get("configMap", {}).get("name")
        if ref in renamed:
            volume["configMap"]["name"] = f"{ref}-{node}"
    if node:
        spec.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node


def _pairs(values: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise SystemExit(f"overlay-crds: {what} must be KEY=VALUE, got {value!r}")
        pairs[key] = rest
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--image", default="")
    parser.add_argument("--host-path", action="append", default=[])
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--node", default="")
    args = parser.parse_args()
    docs = [d for f in args.files for d in yaml.safe_load_all(f.read_text()) if d]
    config = {k: json.loads(v) for k, v in _pairs(args.config, "--config").items()}
    result = overlay(docs, args.image, _pairs(args.host_path, "--host-path"), config, args.node)
    yaml.safe_dump_all(result, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
