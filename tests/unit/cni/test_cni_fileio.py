"""write_atomic: exact mode, whole replacement, nothing left behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cni.fileio import make_durable, start_sync, start_write, write_atomic


def test_writes_with_the_exact_mode_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "f"
    old = os.umask(0o077)
    try:
        write_atomic(target, b"one", 0o644)
    finally:
        os.umask(old)
    assert target.read_bytes() == b"one"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_replaces_a_read_only_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "f"
    write_atomic(target, b"old", 0o444)
    write_atomic(target, b"new" * 10000, 0o444, fsync=True)
    assert target.read_bytes() == b"new" * 10000
    assert os.listdir(tmp_path) == ["f"]


def test_a_failure_raises_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "dir", b"x")  # cannot rename a file over a directory
    assert os.listdir(tmp_path) == ["dir"] and os.listdir(tmp_path / "dir") == []


def _synced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the paths os.fsync is called on."""
    paths: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths


def test_fsync_syncs_the_data_then_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = _synced(monkeypatch)
    write_atomic(tmp_path / "f", b"x", fsync=True)
    # the data before the rename (the temporary file), then the new name
    assert Path(synced[0]).name.startswith(".f.") and synced[1:] == [str(tmp_path)]


def test_make_durable_syncs_each_file_and_each_directory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    for path in (tmp_path / "a", sub / "b", sub / "c"):
        write_atomic(path, b"x")
    synced = _synced(monkeypatch)
    make_durable([tmp_path / "a", sub / "b", tmp_path / "gone", sub / "c"])
    assert sorted(synced) == sorted(
        str(p) for p in (tmp_path / "a", sub / "b", sub / "c", tmp_path, sub)
    )


def test_a_sync_after_background_writes_waits_for_them_and_raises_their_error(
    tmp_path: Path,
) -> None:
    target = tmp_path / "f"
    written = start_write(target, b"data" * 1000)
    start_sync([target], after=[written]).wait()
    assert target.read_bytes() == b"data" * 1000

    failed = start_write(tmp_path / "missing-dir" / "f", b"x")
    with pytest.raises(FileNotFoundError):
        start_sync([tmp_path / "missing-dir" / "f"], after=[failed]).wait()
