"""The sandbox image of the runtime tier, built locally: no registry is reachable here.

containerd's CRI needs an image only to create each pod's pause container. `build_pause_image`
compiles `pause.c` with `cc -Os -static` and packs the binary into an OCI image-layout
tarball (one uncompressed layer holding `/pause`), named through the
`io.containerd.image.name` annotation so `ctr images import` registers it under `name`.
Everything it writes is a build output under the test's temp dir, never committed.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("pause.c")
NAME = "localhost/plexus-test/pause:1"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_LAYER = "application/vnd.oci.image.layer.v1.tar"


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def build_pause_image(workdir: Path, name: str = NAME) -> Path:
    """Compile the pause binary and write `workdir/pause-image.tar`; return the tarball's path."""
    cc = compiler()
    assert cc is not None, "no C compiler (run make setup)"
    binary = workdir / "pause"
    subprocess.run(
        [cc, "-Os", "-s", "-static", "-o", str(binary), str(SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    layer = _layer(binary.read_bytes())
    layer_digest = _digest(layer)
    config = _json(
        {
            "architecture": _ARCH.get(platform.machine(), platform.machine()),
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": _MANIFEST,
            "config": {"mediaType": _CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": _LAYER, "digest": layer_digest, "size": len(layer)}],
        }
    )
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": _MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
    )
    tarball = workdir / "pause-image.tar"
    with tarfile.open(tarball, "w") as tar:
        _add(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add(tar, "index.json", index)
        for blob in (layer, config, manifest):
            _add(tar, "blobs/sha256/" + _digest(blob).split(":", 1)[1], blob)
    return tarball


def _layer(binary: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        _add(tar, "pause", binary, mode=0o755)
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def _json(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
