"""Runtime side of CNI: find a plugin binary and exec it the way libcni does."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from cni import callscope
from cni.communicate import MAX_OUTPUT, OutputOverflow, communicate
from cni.env import ENV_VARS, cni_env
from cni.errors import CNIError, ErrorCode
from cni.version import CURRENT_VERSION

log = logging.getLogger("plexus.cni")

_BUSY_RETRIES = 5
"""Retries when the binary is being written ("text file busy"), a second apart, as libcni."""


def find_plugin(plugin_type: str, paths: Sequence[str], root: str = "") -> str:
    """The first regular executable file named `plugin_type` in `paths` (seen from `root`)."""
    if not plugin_type or "/" in plugin_type:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"invalid plugin name {plugin_type!r}",
            "a plugin type is a file name looked up in CNI_PATH and must not contain '/'",
        )
    for directory in paths:
        candidate = os.path.join(directory, plugin_type)
        outside = seen_from(root, candidate) if root else candidate
        if os.path.isfile(outside) and os.access(outside, os.X_OK):
            return candidate
    raise CNIError(
        ErrorCode.INVALID_CONFIG,
        f'failed to find plugin "{plugin_type}" in path [{" ".join(paths)}]',
        "install the plugin binary into one of those directories or fix CNI_PATH",
    )


_MAX_LINKS = 40  # as the kernel's path walk (ELOOP past it)


def seen_from(root: str, path: str) -> str:
    """`path` as a process chrooted at `root` resolves it, named from outside: absolute
    symlinks (a host's /opt/cni/bin often links into /usr/lib/cni) point inside `root`."""
    real = root + path
    for _ in range(_MAX_LINKS):
        if not os.path.islink(real):
            return real
        target = os.readlink(real)
        real = (
            root + target if target.startswith("/") else os.path.join(os.path.dirname(real), target)
        )
    return real


class Executor(Protocol):
    """Runs one plugin: `env` holds the CNI_* variables; returns stdout or raises CNIError."""

    def run(self, plugin_type: str, stdin: bytes, env: Mapping[str, str]) -> bytes: ...

    def hosts(self, plugin_type: str) -> bool:
        """True if `plugin_type` runs in this process (no exec)."""
        ...


class ExecExecutor:
    """Executor that execs plugin binaries found in env["CNI_PATH"].

    With `chroot_dir` (the meta config's `chrootDir`, e.g. the host's / mounted at
    /hostroot) each plugin runs chrooted there, CNI_PATH resolved inside it: a daemon in
    a container runs the delegates against the host's files (IPAM state, sockets, configs).
    """

    def __init__(
        self,
        timeout: float | None = None,
        chroot_dir: str = "",
        guard: Callable[[str, str], None] | None = None,
    ) -> None:
        self.timeout = timeout
        self.chroot_dir = chroot_dir.rstrip("/")
        self.guard = guard
        """Called with (type, binary as seen from here) before each exec; raises to refuse."""

    def hosts(self, plugin_type: str) -> bool:
        """Never: every plugin is exec'd."""
        return False

    def run(self, plugin_type: str, stdin: bytes, env: Mapping[str, str]) -> bytes:
        """Exec the plugin; a non-zero exit becomes the CNIError it printed."""
        paths = [p for p in env.get("CNI_PATH", "").split(os.pathsep) if p]
        binary = find_plugin(plugin_type, paths, self.chroot_dir)
        if self.guard is not None:
            self.guard(
                plugin_type, seen_from(self.chroot_dir, binary) if self.chroot_dir else binary
            )
        # Drop any CNI_* we were called with so a stale value cannot reach the plugin.
        full_env = {k: v for k, v in os.environ.items() if k not in ENV_VARS} | dict(env)
        command = env.get("CNI_COMMAND", "")
        scope = callscope.current()
        scope.check(plugin_type, command)
        timeout = self.timeout if self.timeout is not None else scope.timeout
        attempt = 0
        while True:
            returncode, stdout, stderr = _exec(
                plugin_type, binary, stdin, full_env, timeout, self.chroot_dir
            )
            if not (returncode == _EXEC_FAILED and _BUSY in stderr) or attempt == _BUSY_RETRIES:
                break
            attempt += 1
            time.sleep(1)
        if stderr:
            log.info("plugin stderr: %s", stderr, extra={"plugin": plugin_type})
        scope.check(plugin_type, command)
        if returncode != 0:
            raise _plugin_error(returncode, stdout, stderr)
        return stdout


_EXEC_FAILED = 126
"""The exit status of the wrapper (or chroot) when it cannot exec the plugin."""
_BUSY = os.strerror(errno.ETXTBSY)


def _exec(
    plugin_type: str,
    binary: str,
    stdin: bytes,
    env: dict[str, str],
    timeout: float | None,
    chroot_dir: str,
) -> tuple[int, bytes, str]:
    """Run the plugin once: exit status, stdout, stderr.

    Through the call's wrapper (callscope.CallScope.wrapper), so that a killed daemon
    leaves no delegate to finish an ADD behind the runtime's DEL; in its own process
    group, so that a timeout or a cancelled call kills whatever the plugin spawned too.
    Chrooted by the wrapper (or chroot(8)), not by a preexec_fn: that would fork the
    whole daemon without vfork, and a fork of a process running gRPC's threads
    (PodResources) breaks in the child (seen: the plugin never ran, gRPC's poller
    reporting a bad descriptor).
    """
    scope = callscope.current()
    try:
        proc = subprocess.Popen(
            scope.argv(binary, chroot_dir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            process_group=0,
        )
    except OSError as err:
        if err.errno == errno.ETXTBSY:
            return _EXEC_FAILED, b"", _BUSY
        raise CNIError(ErrorCode.IO_FAILURE, f"cannot exec plugin {binary}", str(err)) from None
    with scope.running(proc, env.get("CNI_COMMAND", "")):
        try:
            stdout, stderr, expired = communicate(proc, stdin, timeout, scope.fed)
        except OutputOverflow as exc:
            raise CNIError(
                ErrorCode.IO_FAILURE,
                f"plugin {plugin_type} printed more than {MAX_OUTPUT >> 20} MiB on "
                f"{exc.stream} and was killed",
                "a CNI plugin prints one JSON result or error",
            ) from None
    if expired:
        raise CNIError(
            ErrorCode.IO_FAILURE,
            f"plugin {plugin_type} timed out after {timeout:g} s and was killed",
            "raise delegateTimeoutSeconds if the plugin is slow but healthy",
        )
    return proc.returncode, stdout, stderr.decode(errors="replace").strip()


def _plugin_error(returncode: int, stdout: bytes, stderr: str) -> CNIError:
    """The CNIError a failed plugin reported, or an I/O error describing its output."""
    if not stdout.strip():
        if stderr:
            return CNIError(ErrorCode.IO_FAILURE, f"netplugin failed: {json.dumps(stderr)}")
        return CNIError(
            ErrorCode.IO_FAILURE,
            f"netplugin failed with no error message: exit status {returncode}",
        )
    text = stdout.decode(errors="replace").strip()
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return CNIError.from_dict(data)
    except (ValueError, CNIError) as err:
        return CNIError(ErrorCode.IO_FAILURE, f"netplugin failed: {json.dumps(text)}", str(err))


def version_info(executor: Executor, plugin_type: str, paths: Sequence[str]) -> dict[str, Any]:
    """Ask a plugin which spec versions it supports (the VERSION verb)."""
    env = cni_env("VERSION", "", "", "", (), paths)
    stdin = json.dumps({"cniVersion": CURRENT_VERSION}).encode()
    out = executor.run(plugin_type, stdin, env)
    try:
        info = json.loads(out)
    except ValueError as err:
        raise CNIError(
            ErrorCode.DECODE_FAILURE,
            f"plugin {plugin_type!r} printed invalid VERSION output",
            str(err),
        ) from None
    if not isinstance(info, dict) or not isinstance(info.get("supportedVersions"), list):
        raise CNIError(
            ErrorCode.DECODE_FAILURE,
            f"plugin {plugin_type!r} VERSION output has no 'supportedVersions' list",
        )
    return info
