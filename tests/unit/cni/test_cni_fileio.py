"""write_atomic: exact mode, whole replacement, nothing left behind; file names against
the filesystem's limit; regular files opened and read without following anything else."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cni.fileio import (
    make_durable,
    name_problem,
    open_regular,
    read_regular,
    start_sync,
    start_write,
    write_atomic,
)


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


def test_a_name_as_long_as_the_filesystem_allows_is_written(tmp_path: Path) -> None:
    """The temporary name starts with the target's first bytes only: it fits wherever the
    target's name does."""
    name = "é" * 127 + "x"  # 255 bytes
    assert name_problem(name) is None
    write_atomic(tmp_path / name, b"data")
    assert os.listdir(tmp_path) == [name]


def test_name_problem_counts_bytes() -> None:
    assert name_problem("a" * 255) is None
    assert name_problem("é" * 128) == "256 bytes, more than the 255 a file name may have"


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_open_regular_never_opens_or_follows_anything_else(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"secret")
    path = tmp_path / "f"
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer
    else:
        path.mkdir()
    for flags in (os.O_RDONLY, os.O_WRONLY | os.O_CREAT):
        with pytest.raises(OSError, match="not a regular file"):
            open_regular(str(path), flags)
    assert target.read_bytes() == b"secret"


def test_read_regular_reads_up_to_its_limit(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10)
    directory = os.open(tmp_path, os.O_RDONLY)
    try:
        assert read_regular("f", 10, directory) == b"x" * 10
    finally:
        os.close(directory)
    with pytest.raises(OSError, match="holds more than 9 bytes"):
        read_regular(str(tmp_path / "f"), 9)
    with pytest.raises(FileNotFoundError):
        read_regular(str(tmp_path / "missing"), 9)
