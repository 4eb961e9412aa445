"""The Plexus image (Containerfile, built by scripts/build-image.sh) run by the tier's containerd.

The image is built once per machine and cached (/var/cache/plexus-image): a cold build
takes minutes (a Debian base, pip from PyPI), a cached one a second.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.runtime import containerd as ctrd
from tests.runtime.conftest import Runtime

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/plexus-test/plexus:runtime"


def _ctr(rt: Runtime, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    address = ["--address", str(rt.containerd.socket), "--namespace", ctrd.NAMESPACE]
    return subprocess.run(
        [str(rt.containerd.release.ctr), *address, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run(rt: Runtime, command: Sequence[str], mounts: dict[Path, str] | None = None) -> str:
    """Run `command` in a throwaway container of the image; its stdout (exit 0 asserted)."""
    binds = [
        f"--mount=type=bind,src={src},dst={dst},options=rbind:rw"
        for src, dst in (mounts or {}).items()
    ]
    shim = rt.containerd.release.shim  # by path: the one on PATH may be another release's
    runtime = ["--runtime", str(shim)] if shim else []
    name = f"pxt-image-{uuid.uuid4().hex[:8]}"
    done = _ctr(rt, "run", "--rm", *runtime, *binds, IMAGE, name, *command)
    assert done.returncode == 0, f"{command} in the image: {done.stdout} {done.stderr}"
    return done.stdout


def _interpreter(elf: bytes) -> bool:
    """True if a 64-bit ELF has a PT_INTERP header (it needs a dynamic loader)."""
    (phoff,) = struct.unpack_from("<Q", elf, 32)
    size, count = struct.unpack_from("<HH", elf, 54)
    return any(struct.unpack_from("<I", elf, phoff + i * size)[0] == 3 for i in range(count))


@pytest.fixture(scope="module")
def image(runtime: Runtime) -> str:
    built = subprocess.run(
        [str(ROOT / "scripts/build-image.sh"), IMAGE], capture_output=True, text=True, timeout=1700
    )
    assert built.returncode == 0, f"build-image.sh failed:\n{built.stderr[-3000:]}"
    imported = _ctr(runtime, "images", "import", built.stdout.strip().splitlines()[-1])
    assert imported.returncode == 0, f"ctr images import: {imported.stdout} {imported.stderr}"
    return IMAGE


@pytest.mark.timeout(1800)  # a cold image build on a fresh machine
def test_image_serves_every_command_and_installs_only_the_shim(
    runtime: Runtime, image: str, tmp_path: Path
) -> None:
    usage = _run(runtime, ["plexus", "--help"])
    for command in ("daemon", "install-cni", "uninstall-cni", "deviceplugin"):
        assert command in usage

    host_bin = tmp_path / "host-opt-cni-bin"
    host_bin.mkdir()
    (host_bin / "bridge").write_text("the host's own plugin")
    install = ["plexus", "install-cni", "--shim-only", "--bin-dir", "/host/opt/cni/bin"]
    for _ in range(2):  # the init step runs again at every pod restart and node boot
        _run(runtime, install, {host_bin: "/host/opt/cni/bin"})

    assert sorted(os.listdir(host_bin)) == ["bridge", "plexus"]  # no Python binaries
    shim = (host_bin / "plexus").read_bytes()
    assert shim.startswith(b"\x7fELF") and not _interpreter(shim)  # static: runs on any host
    # Run on the host with no daemon: a CNI error on stdout, never an exec failure.
    done = subprocess.run(
        [str(host_bin / "plexus")],
        input=json.dumps({"cniVersion": "1.0.0", "socketDir": str(tmp_path / "none")}),
        env={"CNI_COMMAND": "STATUS"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "daemon" in json.loads(done.stdout)["msg"]

    assert _run(runtime, ["sh", "-c", "command -v cc gcc || echo none"]).strip() == "none"
