"""`plexus install-cni` / `uninstall-cni` on a temp bin dir: atomic, idempotent, shim-only."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from meta.install import BINARIES, SHIM_NAME, install_binaries, uninstall


def _prebuilt(tmp_path: Path, content: bytes = b"\x7fELF prebuilt shim") -> Path:
    shim = tmp_path / "libexec" / SHIM_NAME
    shim.parent.mkdir(exist_ok=True)
    shim.write_bytes(content)
    return shim


def test_shim_only_installs_just_the_prebuilt_shim(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    prebuilt = _prebuilt(tmp_path)

    written = install_binaries(bin_dir, shim_only=True, prebuilt=prebuilt)

    assert written == [bin_dir / SHIM_NAME]
    assert sorted(p.name for p in bin_dir.iterdir()) == [SHIM_NAME]  # no Python binaries
    assert (bin_dir / SHIM_NAME).read_bytes() == prebuilt.read_bytes()
    assert (bin_dir / SHIM_NAME).stat().st_mode & 0o777 == 0o755


def test_replacing_a_running_shim_renames_a_new_file_over_it(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    install_binaries(bin_dir, shim_only=True, prebuilt=_prebuilt(tmp_path, b"old"))
    shim = bin_dir / SHIM_NAME
    with shim.open("rb") as running:  # what an exec'ing runtime holds
        old_inode = shim.stat().st_ino
        install_binaries(bin_dir, shim_only=True, prebuilt=_prebuilt(tmp_path, b"new"))
        assert running.read() == b"old"  # the old file was never written into
    assert shim.stat().st_ino != old_inode and shim.read_bytes() == b"new"


def test_rerun_is_idempotent_and_clears_an_interrupted_install(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    prebuilt = _prebuilt(tmp_path)
    install_binaries(bin_dir, shim_only=True, prebuilt=prebuilt)
    inode = (bin_dir / SHIM_NAME).stat().st_ino
    (bin_dir / f".{SHIM_NAME}.4242.17.tmp").write_bytes(b"half a copy")  # killed mid-copy

    install_binaries(bin_dir, shim_only=True, prebuilt=prebuilt)  # the next boot's init step

    assert sorted(p.name for p in bin_dir.iterdir()) == [SHIM_NAME]
    assert (bin_dir / SHIM_NAME).stat().st_ino == inode  # an identical shim is left alone


def test_full_install_compiles_the_shim_without_a_prebuilt_one(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    install_binaries(bin_dir, prebuilt=tmp_path / "none")

    assert sorted(p.name for p in bin_dir.iterdir()) == sorted([SHIM_NAME, *BINARIES])
    done = subprocess.run([str(bin_dir / SHIM_NAME)], input=b"{", capture_output=True)
    assert done.returncode != 0 and b'"code"' in done.stdout  # a real binary, a CNI error
    assert (bin_dir / "plexus-thin").read_text().startswith("#!/")


def _compiled_shim(tmp_path: Path) -> bytes:
    bin_dir = tmp_path / "bin"
    install_binaries(bin_dir, prebuilt=tmp_path / "none")
    done = subprocess.run([str(bin_dir / SHIM_NAME)], input=b"{", capture_output=True)
    assert done.returncode != 0 and b'"code"' in done.stdout  # a real binary, a CNI error
    return (bin_dir / SHIM_NAME).read_bytes()


@pytest.mark.skipif(
    shutil.which("musl-gcc") is None, reason="musl-gcc missing (make setup installs musl-tools)"
)
def test_the_shim_is_compiled_against_musl_when_it_is_installed(tmp_path: Path) -> None:
    assert b"glibc" not in _compiled_shim(tmp_path)  # glibc's static start costs ~0.55 ms


def test_without_musl_the_shim_is_compiled_by_the_system_cc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name: None if name == "musl-gcc" else real_which(name)
    )
    assert b"glibc" in _compiled_shim(tmp_path)


def test_uninstall_removes_config_binaries_and_state_only(tmp_path: Path) -> None:
    install_binaries(tmp_path / "opt/cni/bin", prebuilt=_prebuilt(tmp_path))
    (tmp_path / "opt/cni/bin/bridge").write_text("not ours")
    net_d = tmp_path / "etc/cni/net.d"
    net_d.mkdir(parents=True)
    (net_d / "00-plexus.conflist").write_text("{}")
    (net_d / "10-primary.conflist").write_text("{}")
    (tmp_path / "var/lib/cni/plexus/records").mkdir(parents=True)

    removed = uninstall(
        tmp_path,
        "/opt/cni/bin",
        "/etc/cni/net.d/00-plexus.conflist",
        ["/var/lib/cni/plexus", "/run/plexus"],
    )

    assert removed[0] == net_d / "00-plexus.conflist"  # first: the runtime stops calling us
    assert sorted(p.name for p in (tmp_path / "opt/cni/bin").iterdir()) == ["bridge"]
    assert [p.name for p in net_d.iterdir()] == ["10-primary.conflist"]
    assert not (tmp_path / "var/lib/cni/plexus").exists()
    assert uninstall(tmp_path, "/opt/cni/bin", "/etc/cni/net.d/00-plexus.conflist", []) == []
