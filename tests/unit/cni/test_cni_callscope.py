"""Per-call bounds on plugin execs: timeout, cancellation, death with the daemon."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cni import callscope
from cni.env import cni_env
from cni.errors import CNIError, ErrorCode
from cni.invoke import ExecExecutor
from meta.install import SHIM_NAME, install_binaries

PluginMaker = Callable[[str, str], Path]
REPO = Path(__file__).resolve().parents[3]


def _sleeper(make_plugin: PluginMaker, pids: Path) -> None:
    """A plugin that starts a child, records both pids, and sleeps."""
    make_plugin(
        "sleeper",
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(300)\n",
    )


def _wait_for_pids(pids: Path) -> list[int]:
    deadline = time.monotonic() + 30
    while not pids.exists() or not pids.read_text():
        assert time.monotonic() < deadline, "the plugin never started"
        time.sleep(0.02)
    return [int(p) for p in pids.read_text().split()]


def _gone(pid: int) -> bool:
    """Exited (reaped, or a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if not _gone(p)]}"
        time.sleep(0.05)


def _env(bin_dir: Path, command: str = "ADD") -> dict[str, str]:
    return cni_env(command, "cid", "/run/netns/x", "eth0", (), [str(bin_dir)])


def test_the_scope_timeout_kills_the_plugin_and_what_it_spawned(
    make_plugin: PluginMaker, bin_dir: Path, tmp_path: Path
) -> None:
    _sleeper(make_plugin, tmp_path / "pids")
    with callscope.call_scope() as scope, pytest.raises(CNIError) as exc:
        scope.timeout = 1
        ExecExecutor().run("sleeper", b"{}", _env(bin_dir))
    assert exc.value.code == ErrorCode.IO_FAILURE
    assert exc.value.msg == "plugin sleeper timed out after 1 s and was killed"
    _wait_gone(_wait_for_pids(tmp_path / "pids"))


def test_a_cancelled_call_kills_its_add_refuses_more_and_still_rolls_back(
    make_plugin: PluginMaker, bin_dir: Path, tmp_path: Path
) -> None:
    _sleeper(make_plugin, tmp_path / "pids")
    make_plugin("noop", "print('{}')\n")
    scopes: list[callscope.CallScope] = []
    errors: list[CNIError] = []

    def call() -> None:
        with callscope.call_scope() as scope:
            scopes.append(scope)
            try:
                ExecExecutor().run("sleeper", b"{}", _env(bin_dir))
            except CNIError as err:
                errors.append(err)
            with pytest.raises(CNIError):
                ExecExecutor().run("noop", b"{}", _env(bin_dir))  # no new ADD
            assert ExecExecutor().run("noop", b"{}", _env(bin_dir, "DEL")).strip() == b"{}"

    worker = threading.Thread(target=call)
    worker.start()
    pids = _wait_for_pids(tmp_path / "pids")
    scopes[0].cancel("the shim went away")
    worker.join(30)
    assert not worker.is_alive()
    assert [(e.code, e.msg) for e in errors] == [
        (ErrorCode.TRY_AGAIN_LATER, "plugin sleeper cancelled: the shim went away")
    ]
    _wait_gone(pids)


def test_a_plugin_execd_through_the_shim_dies_with_the_process_that_execd_it(
    make_plugin: PluginMaker, bin_dir: Path, tmp_path: Path
) -> None:
    _sleeper(make_plugin, tmp_path / "pids")
    (shim,) = [p for p in install_binaries(tmp_path / "installed") if p.name == SHIM_NAME]
    runner = (
        "from cni import callscope\nfrom cni.env import cni_env\n"
        "from cni.invoke import ExecExecutor\n"
        f"env = cni_env('ADD', 'cid', '/x', 'eth0', (), [{str(bin_dir)!r}])\n"
        "with callscope.call_scope() as scope:\n"
        f"    scope.wrapper = {str(shim)!r}\n"
        "    ExecExecutor().run('sleeper', b'{}', env)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", runner], cwd=REPO)
    try:
        plugin, _ = _wait_for_pids(tmp_path / "pids")
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        _wait_gone([plugin])
    finally:
        for pid in _wait_for_pids(tmp_path / "pids"):
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_shim_execs_a_delegate_only_for_its_parent(tmp_path: Path) -> None:
    """`--exec-delegate PID ROOT BINARY` ("/": not chrooted; chroots: tests/netns/
    test_chroot.py), the PID BINARY form of earlier daemons, and nothing else."""
    (shim,) = install_binaries(tmp_path / "installed", shim_only=True, prebuilt=tmp_path / "none")
    me = str(os.getpid())

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [str(shim), "--exec-delegate", *args], cwd=tmp_path, capture_output=True
        )

    assert run(me, "/", "/bin/pwd").stdout == f"{tmp_path}\n".encode()
    assert run(me, "/bin/pwd").stdout == f"{tmp_path}\n".encode()
    assert run(str(os.getppid()), "/", "/bin/pwd").returncode == 126  # not the parent
    usage = run(me, "/", "/bin/pwd", "extra")
    assert (usage.returncode, usage.stdout) == (126, b"")
    assert b"usage: plexus --exec-delegate PID ROOT BINARY" in usage.stderr
    missing = run(me, "/", str(tmp_path / "none"))
    assert missing.returncode == 126 and b"cannot exec" in missing.stderr
