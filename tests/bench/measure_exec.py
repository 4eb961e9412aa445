"""One plugin exec: its pipes and wait, and the shim it is exec'd through.

    .venv/bin/python3 -m tests.bench.measure_exec [rounds]

Execs /bin/cat (a plugin that answers at once) with a CNI-sized stdin and a 30-variable
env, in its own process group as cni/invoke.py does, and prints the medians, rounds
interleaved: Popen.communicate with a timeout (how invoke.py exec'd plugins before),
without one (no bound on a plugin that hangs), and cni.communicate with the timeout;
then cni.communicate of /bin/cat through `plexus --exec-delegate` (how the daemon execs
every delegate), the shim compiled statically with glibc and with musl (when musl-gcc
is installed); and chrooted (chrootDir) by chroot(8) exec'd first or by the shim itself.
Last, how soon a Go plugin wants its stdin: the reference `bridge` (which fails at once
on a missing netns) with its config written at once, 0.8 ms or 2 ms after the exec.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from cni.communicate import communicate
from meta.install import SHIM_CFLAGS, SHIM_SOURCE

ENV = {f"CNI_VAR{i}": "x" * 40 for i in range(30)}
STDIN = b'{"cniVersion":"1.0.0","name":"default","type":"bridge","bridge":"cni0"}' * 20
TIMEOUT = 60.0
BRIDGE = Path("/usr/lib/cni/bridge")


def _start(
    argv: tuple[str, ...] = ("/bin/cat",), env: dict[str, str] = ENV
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        process_group=0,
    )


def _popen_timeout() -> bytes:
    return _start().communicate(STDIN, timeout=TIMEOUT)[0]


def _popen_unbounded() -> bytes:
    return _start().communicate(STDIN)[0]


def _ours(argv: tuple[str, ...] = ("/bin/cat",)) -> bytes:
    return communicate(_start(argv), STDIN, TIMEOUT)[0]


def _go_plugin(late: float) -> bytes:
    """The reference bridge's ADD on a missing netns, its stdin written `late` s after
    the exec (the calling thread busy meanwhile, as when another holds the interpreter)."""
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "x", "CNI_NETNS": "/nonexistent"}
    proc = _start((str(BRIDGE),), {**env, "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent"})
    until = time.perf_counter() + late
    while time.perf_counter() < until:
        pass
    return communicate(proc, b'{"cniVersion":"1.0.0","name":"n","type":"bridge"}', TIMEOUT)[0]


def _shims(directory: Path) -> dict[str, Path]:
    """The shim compiled statically with each C library whose compiler is installed."""
    built = {}
    for libc, compiler in (("glibc", "cc"), ("musl", "musl-gcc")):
        if shutil.which(compiler):
            binary = directory / f"plexus-{libc}"
            subprocess.run(
                [compiler, *SHIM_CFLAGS, "-o", str(binary), str(SHIM_SOURCE)], check=True
            )
            built[libc] = binary
    return built


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    with tempfile.TemporaryDirectory(prefix="plexus-measure-exec-") as directory:
        contenders: dict[str, Callable[[], bytes]] = {
            "Popen.communicate(timeout)": _popen_timeout,
            "Popen.communicate()": _popen_unbounded,
            "cni.communicate(timeout)": _ours,
        }
        me = str(os.getpid())
        shims = _shims(Path(directory))
        for libc, shim in shims.items():
            argv: tuple[str, ...] = (str(shim), "--exec-delegate", me, "/", "/bin/cat")
            contenders[f"cni.communicate(timeout) via the shim ({libc})"] = partial(_ours, argv)
        # chrootDir's execs, at "/." (a chroot that changes nothing), with the last shim
        # built: chroot(8) then the shim, as before the shim chrooted, against the shim.
        libc, shim = list(shims.items())[-1]
        chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        argv = (chroot, "/.", str(shim), "--exec-delegate", me, "/", "/bin/cat")
        contenders[f"chrooted: chroot(8), the shim ({libc})"] = partial(_ours, argv)
        argv = (str(shim), "--exec-delegate", me, "/.", "/bin/cat")
        contenders[f"chrooted: the shim ({libc}) chrooting"] = partial(_ours, argv)
        _measure(contenders, rounds, STDIN)
    if BRIDGE.exists():
        late: dict[str, Callable[[], bytes]] = {
            f"bridge, stdin {ms} ms after the exec": partial(_go_plugin, ms / 1000)
            for ms in (0, 0.8, 2)
        }
        _measure(late, rounds, _go_plugin(0))
    else:
        print(f"{BRIDGE} is not installed (scripts/setup-base.sh installs it): no stdin rows")


def _measure(contenders: dict[str, Callable[[], bytes]], rounds: int, output: bytes) -> None:
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(rounds):
        order = list(contenders) if i % 2 else list(reversed(contenders))
        for name in order:
            started = time.perf_counter()
            assert contenders[name]() == output
            samples[name].append((time.perf_counter() - started) * 1000)
    for name, times in samples.items():
        print(f"{name}: {statistics.median(times):.3f} ms (median of {rounds})")


if __name__ == "__main__":
    main()
