"""Exchanging a child's pipes within a timeout, and waiting for its exit on a pidfd."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from cni.communicate import MAX_OUTPUT, OutputOverflow, communicate

BIG = bytes(range(256)) * 4096  # 1 MiB: far more than a pipe holds


def _start(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["/bin/sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0,
    )


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def test_large_input_and_output_both_ways() -> None:
    proc = _start("cat; echo done >&2; exit 3")
    stdout, stderr, expired = communicate(proc, BIG, 10)
    assert (stdout == BIG, stderr, expired, proc.returncode) == (True, b"done\n", False, 3)


def test_a_child_that_never_reads_its_input() -> None:
    proc = _start("exec 0<&-; echo answered")
    stdout, _, expired = communicate(proc, BIG, 10)
    assert (stdout, expired, proc.returncode) == (b"answered\n", False, 0)


@pytest.mark.parametrize("data", [b'{"cniVersion": "1.0.0"}', BIG], ids=["fits the pipe", "1 MiB"])
def test_fed_is_told_once_the_child_has_all_its_input(data: bytes) -> None:
    proc = _start("cat")
    stdin = proc.stdin
    assert stdin is not None
    seen: list[bool] = []
    stdout, _, _ = communicate(proc, data, 10, lambda: seen.append(stdin.closed))
    assert (stdout == data, seen) == (True, [True])


def test_no_input_closes_stdin_at_once() -> None:
    proc = _start("cat; echo eof")
    assert communicate(proc, b"", 10)[:2] == (b"eof\n", b"")


def test_output_before_the_timeout_is_kept_and_the_group_killed() -> None:
    proc = _start("echo partial; sleep 30 & wait")
    started = time.monotonic()
    stdout, _, expired = communicate(proc, b"", 0.5)
    assert (stdout, expired) == (b"partial\n", True)
    assert time.monotonic() - started < 10
    assert proc.returncode == -9


def test_a_child_that_closes_its_output_and_stays_is_killed_at_the_timeout() -> None:
    proc = _start("exec >&- 2>&-; sleep 30")
    started = time.monotonic()
    _, _, expired = communicate(proc, b"", 0.5)
    assert expired and 0.4 < time.monotonic() - started < 10
    assert proc.returncode == -9 and _gone(proc.pid)


def test_an_exit_after_closing_the_output_is_waited_for_on_the_pidfd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[int] = []
    real = os.pidfd_open

    def spy(pid: int, flags: int = 0) -> int:
        opened.append(pid)
        return real(pid, flags)

    monkeypatch.setattr(os, "pidfd_open", spy)
    proc = _start("exec >&- 2>&-; sleep 0.3; exit 4")
    _, _, expired = communicate(proc, b"", 10)
    assert (expired, proc.returncode) == (False, 4)
    assert opened == [proc.pid]


@pytest.mark.parametrize(("timeout", "expired", "returncode"), [(10, False, 4), (0.1, True, -9)])
def test_without_pidfds_the_exit_is_polled_for(
    monkeypatch: pytest.MonkeyPatch, timeout: float, expired: bool, returncode: int
) -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    proc = _start("exec >&- 2>&-; sleep 0.3; exit 4")
    assert communicate(proc, b"", timeout)[2] is expired
    assert proc.returncode == returncode


def test_output_of_exactly_the_bound_is_kept() -> None:
    proc = _start(f"head -c {MAX_OUTPUT} /dev/zero; head -c {MAX_OUTPUT} /dev/zero >&2")
    stdout, stderr, expired = communicate(proc, b"", 30)
    assert (len(stdout), len(stderr), expired, proc.returncode) == (
        MAX_OUTPUT,
        MAX_OUTPUT,
        False,
        0,
    )


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_past_the_bound_kills_the_group(stream: str, tmp_path: Path) -> None:
    """A plugin printing too much is killed, with what it spawned, once it is past the
    bound on either stream: its output is not held, the call does not wait for the
    timeout."""
    pidfile = tmp_path / "helper.pid"
    redirect = "" if stream == "stdout" else ">&2"
    flood = f"head -c {4 * MAX_OUTPUT} /dev/zero {redirect}"
    proc = _start(f"sleep 60 & echo $! > {pidfile}; {flood}; exec sleep 60")
    started = time.monotonic()
    with pytest.raises(OutputOverflow) as exc:
        communicate(proc, b"", 20)
    assert exc.value.stream == stream and str(exc.value) == f"more than 8 MiB on {stream}"
    assert time.monotonic() - started < 15
    assert proc.returncode == -9 and proc.stdout is not None and proc.stdout.closed
    helper = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while not _dead(helper) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _dead(helper)


def _dead(pid: int) -> bool:
    """Gone, or a zombie its new parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
