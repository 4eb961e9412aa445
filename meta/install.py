"""`plexus install-cni` and `plexus uninstall-cni`: Plexus's files in a node's CNI dirs.

`plexus` is the shim (meta/shim/shim.c): copied from the one prebuilt beside this
installation (the image's, at `<prefix>/libexec/plexus/plexus`), else compiled here
(`shim_compiler`). The Python binaries run with this installation's interpreter, so
they belong only on hosts where Plexus itself is installed; a DaemonSet install
(`shim_only`) puts nothing but the shim on the host.

Every file is written under a temp name in the target dir and renamed into place: safe
over a binary the runtime is executing, and a re-run (every node boot) is harmless.
"""

from __future__ import annotations

import filecmp
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cni.errors import CNIError, ErrorCode
from cni.fileio import remove_partials, write_atomic

log = logging.getLogger("plexus.install")

SHIM_SOURCE = Path(__file__).parent / "shim" / "shim.c"
SHIM_NAME = "plexus"
PREBUILT_SHIM = Path(sys.prefix) / "libexec" / "plexus" / SHIM_NAME
# Each Python binary: its name and the module whose main() it runs.
BINARIES = {
    "plexus-thin": "meta.shim.thin",
    "plexus-macvlan": "delegates.macvlan",
    "plexus-ipvlan": "delegates.ipvlan",
    "plexus-sriov": "delegates.sriov",
}

_TEMPLATE = """#!{python} -I
# Installed by `plexus install-cni`; runs Plexus from {prefix}.{identity}
from {module} import main

main()
"""
IDENTITY = b"plexus-cni-meta-plugin"
"""In the shim and plexus-thin (and in no delegate): how the daemon recognises the
meta-plugin's own executables under any name, to refuse running itself as a delegate."""
_META_BINARIES = frozenset({"plexus-thin"})
_SCAN_CHUNK = 1 << 20
_KNOWN_KEPT = 256
_known: dict[tuple[int, int, int, int], bool] = {}


def install_binaries(
    bin_dir: str | Path, shim_only: bool = False, prebuilt: Path = PREBUILT_SHIM
) -> list[Path]:
    """Install the shim (and unless `shim_only` the Python binaries) into `bin_dir`."""
    target = Path(bin_dir)
    target.mkdir(parents=True, exist_ok=True)
    names = [SHIM_NAME] if shim_only else [SHIM_NAME, *BINARIES]
    for name in names:
        remove_partials(target / name)  # an install killed before its rename
    written = []
    if not shim_only:
        for name, module in BINARIES.items():
            identity = f" ({IDENTITY.decode()})" if name in _META_BINARIES else ""
            text = _TEMPLATE.format(
                python=sys.executable, prefix=sys.prefix, module=module, identity=identity
            )
            written.append(_place(target / name, text.encode()))
    if prebuilt.is_file():
        if not _same(prebuilt, target / SHIM_NAME):
            _place(target / SHIM_NAME, prebuilt.read_bytes())
        written.append(target / SHIM_NAME)
    else:
        written.append(_place(target / SHIM_NAME, _compile_shim()))
    return written


def is_own_executable(path: str) -> bool:
    """True if the file at `path` is the Plexus meta-plugin (the shim or plexus-thin),
    whatever its name: it holds IDENTITY. Remembered per file version (inode, size, mtime)."""
    try:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if (known := _known.get(key)) is not None:
            return known
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        found = _holds(fd, IDENTITY)
    finally:
        os.close(fd)
    if len(_known) >= _KNOWN_KEPT:
        _known.clear()
    _known[key] = found
    return found


def _holds(fd: int, needle: bytes) -> bool:
    tail = b""
    while chunk := os.read(fd, _SCAN_CHUNK):
        if needle in tail + chunk:
            return True
        tail = chunk[-len(needle) :]
    return False


def uninstall(root: str | Path, bin_dir: str, conf_file: str, state_dirs: list[str]) -> list[Path]:
    """Remove Plexus's CNI config, binaries and state dirs (paths taken under `root`)."""

    def under(path: str) -> Path:
        return Path(root) / path.lstrip("/")

    # The config first: the runtime stops calling the shim before the shim goes.
    paths = [under(conf_file)]
    paths += [under(bin_dir) / name for name in (SHIM_NAME, *BINARIES)]
    paths += [under(d) for d in state_dirs]
    removed = []
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_symlink() or path.exists():
            path.unlink()
        else:
            continue
        removed.append(path)
    return removed


def _same(a: Path, b: Path) -> bool:
    return b.is_file() and filecmp.cmp(a, b, shallow=False)


SHIM_CFLAGS = ("-O2", "-Wall", "-static")


def shim_compiler() -> list[str] | None:
    """How the shim is compiled: statically, with musl when its gcc wrapper is installed.

    Static, so no dynamic loader runs at each exec. musl, because glibc's static start
    costs ~0.55 ms per exec on a VM (it runs 68 CPUID instructions, each a trap to the
    hypervisor: 6.3 us here), and the shim is exec'd once per CNI call and once per
    delegate exec (`tests.bench.measure_exec`: 0.05 ms over a direct exec with musl,
    0.61 with glibc). Without musl, the system's cc.
    """
    compiler = shutil.which("musl-gcc") or shutil.which("cc") or shutil.which("gcc")
    return [compiler, *SHIM_CFLAGS] if compiler else None


def _compile_shim() -> bytes:
    """The shim, compiled from SHIM_SOURCE."""
    command = shim_compiler()
    if command is None:
        raise CNIError(ErrorCode.NOT_AVAILABLE, "install-cni needs a C compiler (cc) for the shim")
    with tempfile.TemporaryDirectory(prefix="plexus-shim-") as work:
        output = os.path.join(work, SHIM_NAME)
        done = subprocess.run(
            [*command, "-o", output, str(SHIM_SOURCE)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise CNIError(
                ErrorCode.IO_FAILURE,
                f"compiling the plexus shim with {command[0]} failed (it is linked statically: "
                "it needs musl-tools, or libc.a from libc6-dev, on Debian)",
                done.stderr,
            )
        return Path(output).read_bytes()


def _place(path: Path, data: bytes) -> Path:
    """`path` replaced by an executable holding `data`, renamed into place: safe over a
    binary the runtime is executing."""
    write_atomic(path, data, 0o755)
    return path
