"""A node's own mount namespace: what its containerd, kubelet and pods see as the host.

Nodes of the cluster tier share one machine's filesystem, but a DaemonSet gives every node
the same hostPaths, and the kubelet wants host-wide sysctls it must not write. So each
node's containerd and kubelet (and through them its pods) run in a persistent mount
namespace, bound to a file in the node's dir, where the node's own dirs are bind-mounted
over the standard host paths (`/opt/cni/bin`, `/etc/cni/net.d`, its own `/run` and
`/var/lib/cni`, ...) and the kubelet's FAKE /proc/sys files are in place.

In there, every mount the host had is made private first, so nothing mounted in it
(binds, the kubelet's volume tmpfs, containerd's snapshots) reaches the host; then `/` is
made shared again, in a peer group of the node's own, because containerd wants a hostPath
with HostToContainer propagation (a DaemonSet's `/hostroot`) on a shared or slave mount.
Only `/run/netns` stays shared with the host, so a sandbox's netns path works in the host
and in every node. The namespace ends with the unmount of its file and its last process.
Mount points missing on the host are made for it and removed after, when empty and not a
mount point in another session's namespace.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.runtime import containerd as ctrd

SHARED = Path("/run/netns")  # sandbox netns: containerd mounts them, the host uses them
# The outermost host paths this process made as mount points: whichever node closes last
# removes them (another node of the session may still be using them when one closes).
_MADE: set[Path] = set()


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


def mounted_elsewhere(path: Path) -> bool:
    """Whether some process's mount namespace has a mount at `path` (another session's
    node: removing the directory would detach its bind mount)."""
    for mountinfo in Path("/proc").glob("[0-9]*/mountinfo"):
        try:
            lines = mountinfo.read_text().splitlines()
        except OSError:
            continue
        if any(line.split()[4] == str(path) for line in lines):
            return True
    return False


def _peer_groups(mountinfo: str) -> set[str]:
    return {field for field in mountinfo.split() if field.startswith("shared:")}


def _depth(mount: tuple[Path, set[str]]) -> int:
    return len(mount[0].parts)


class NodeMounts:
    """One node's mount namespace; `nsenter()` is the command prefix that enters it."""

    def __init__(self, root: Path) -> None:
        self.holder = root / "mnt"
        self.file = self.holder / "ns"

    def create(self) -> None:
        self.holder.mkdir()
        # A persistent namespace's file must sit on a private mount.
        _run("mount", "--bind", str(self.holder), str(self.holder))
        _run("mount", "--make-private", str(self.holder))
        self.file.touch()
        _run("unshare", f"--mount={self.file}", "--propagation", "unchanged", "true")
        for point, _ in self._mounts():
            if point != SHARED and SHARED not in point.parents:
                try:
                    self._in("mount", "--make-private", str(point))
                except RuntimeError:
                    # Unmounted on the host since the listing (still shared until made
                    # private here: a concurrent image build's overlay): nothing to do.
                    if point in {p for p, _ in self._mounts()}:
                        raise
        self._in("mount", "--make-shared", "/")

    def own_run(self, source: Path) -> None:
        """Give the node its own /run (`source`), with the host's /run/netns kept in it:
        bound again from a bind made before /run is covered, so it stays in the host's
        peer group and sandbox netns mounted there reach the host."""
        keep = self.holder / "netns"
        keep.mkdir()
        self._in("mount", "--bind", str(SHARED), str(keep))
        self.bind(source, Path("/run"))
        (source / SHARED.name).mkdir(exist_ok=True)
        self._in("mount", "--bind", str(keep), str(SHARED))

    def nsenter(self) -> list[str]:
        return ["nsenter", f"--mount={self.file}"]

    def bind(self, source: Path, target: Path, read_only: bool = False) -> None:
        """Bind `source` over `target` in the namespace only (a FAKE, when `read_only`
        over a /proc/sys file)."""
        if not target.exists():
            self._make(target, directory=source.is_dir())
        under = max((m for m in self._mounts() if m[0] in (target, *target.parents)), key=_depth)
        if under[1] & _peer_groups(Path("/proc/self/mountinfo").read_text()):
            raise RuntimeError(f"a bind at {target} would reach the host (under {under[0]})")
        self._in("mount", "--bind", *(["-o", "ro"] if read_only else []), str(source), str(target))

    def close(self) -> None:
        """Drop the namespace's file (it ends with its last process) and the mount points
        made on the host."""
        for path in (self.file, self.holder):
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        for path in sorted(_MADE):
            if not any(mounted_elsewhere(p) for p in (path, *path.rglob("*"))):
                ctrd.remove_empty_tree(path)
                _MADE.discard(path)

    def _in(self, *cmd: str) -> str:
        return _run(*self.nsenter(), *cmd)

    def _mounts(self) -> list[tuple[Path, set[str]]]:
        """The namespace's mount points, each with its peer groups (`shared:N`)."""
        return [
            (Path(line.split()[4].replace("\\040", " ")), _peer_groups(line))
            for line in self._in("cat", "/proc/self/mountinfo").splitlines()
        ]

    def _make(self, target: Path, directory: bool) -> None:
        if not directory:
            raise RuntimeError(f"no file {target} to bind over")
        outermost = target
        while not outermost.parent.exists():
            outermost = outermost.parent
        target.mkdir(parents=True)
        _MADE.add(outermost)
