"""Boot the VM tier's kernel once with virtme-ng and run tests/vm/guest inside it.

The guest sees the host's / read-only (virtiofs when virtiofsd is installed, else the
~3x slower 9p), with throwaway overlays on /tmp, /var, /etc, ..., and writes its
results into a host directory shared with --rwdir.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
GUEST_DIR = REPO / "tests" / "vm" / "guest"
SETUP_SCRIPT = REPO / "scripts" / "setup-vm.sh"
VNG_BIN = REPO / ".venv-vm" / "bin"
# Everything the guest needs besides the kernel: QEMU's igb is the SR-IOV PF, behind an
# emulated Intel IOMMU (first: it must exist before the devices it translates for), so VFs
# have IOMMU groups and vfio-pci can take them; the guest runs it in passthrough mode
# (GUEST_KERNEL_ARGS), so kernel drivers' DMA is not translated and no slower.
QEMU_OPTS = (
    "-device intel-iommu,intremap=on "
    "-device pcie-root-port,id=rp1,chassis=1,slot=1 "
    "-netdev user,id=n1 -device igb,netdev=n1,bus=rp1"
)
GUEST_KERNEL_ARGS = "intel_iommu=on iommu=pt"
# One boot's limit. Under TCG a Python process in the guest takes seconds to start (its
# imports measured 6 s on 2026-12-01, ~2 s weeks before on the same kind of machine), and
# the differential tests start several per test: one boot ran the suite in 966 s. A
# wedged guest is caught much sooner, by STALL_SECONDS.
TIMEOUT = float(os.environ.get("PLEXUS_VM_TIMEOUT", "2400"))
# No console output for this long means a wedged guest: each guest test prints a
# character when it ends and times out after 120 s.
STALL_SECONDS = 240.0
# Boots after a wedged one (see run_guest_suite).
STALL_RETRIES = 2
IN_VM_ENV = "PLEXUS_IN_VM"
RESULTS_ENV = "PLEXUS_VM_RESULTS"


def kernel_version() -> str:
    """The guest kernel pinned by scripts/setup-vm.sh (its VM_KERNEL line)."""
    match = re.search(r"^VM_KERNEL=(\S+)$", SETUP_SCRIPT.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no VM_KERNEL= line in {SETUP_SCRIPT}")
    return match.group(1)


def missing_tooling() -> list[str]:
    """What the host lacks to boot the VM; empty when it can."""
    kernel = kernel_version()
    wanted = {
        "vng (.venv-vm)": (VNG_BIN / "vng").exists() and (VNG_BIN / "virtme-run").exists(),
        "qemu-system-x86_64": shutil.which("qemu-system-x86_64") is not None,
        f"/boot/vmlinuz-{kernel}": Path(f"/boot/vmlinuz-{kernel}").exists(),
        f"/lib/modules/{kernel}": Path(f"/lib/modules/{kernel}").is_dir(),
        "busybox-static": Path("/bin/busybox").exists(),
    }
    return [name for name, ok in wanted.items() if not ok]


def guest_rootfs() -> str:
    """How vng will share / with the guest: virtiofs if it finds a virtiofsd."""
    found = shutil.which("virtiofsd") or Path("/usr/libexec/virtiofsd").exists()
    return "virtiofs" if found else "9p"


def guest_python() -> str:
    """The repo's venv interpreter by full path (the guest has no pyenv on PATH)."""
    venv = REPO / ".venv" / "bin" / "python3"
    return str(venv) if venv.exists() else sys.executable


def collect_guest_tests() -> list[str]:
    """Node ids of the guest tests, collected on the host (where they are skipped).

    A guest file that fails to import is missing here; the host's own collection of
    tests/vm/guest and test_guest_suite_passed report it.
    """
    argv = [guest_python(), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*argv, str(GUEST_DIR.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    prefix = f"{GUEST_DIR.relative_to(REPO).as_posix()}/"
    return [line for line in proc.stdout.splitlines() if line.startswith(prefix) and "::" in line]


def junit_key(nodeid: str) -> str:
    """The `classname::name` pytest's junitxml writes for a node id."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return "::".join([".".join(names[:-1]), names[-1]])


@dataclass
class GuestResult:
    """One guest test as junit recorded it."""

    outcome: str  # passed | failed | error | skipped
    message: str = ""
    details: str = ""
    seconds: float = 0.0


@dataclass
class GuestRun:
    """The outcome of one VM boot running the guest suite."""

    returncode: int | None  # None: killed on timeout
    seconds: float
    results_dir: Path
    results: dict[str, GuestResult] = field(default_factory=dict)

    @property
    def log(self) -> str:
        path = self.results_dir / "console.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def boot_seconds(self) -> float | None:
        """Guest uptime when the guest command started: the boot's share of `seconds`."""
        path = self.results_dir / "boot-seconds"
        try:
            return float(path.read_text())
        except (OSError, ValueError):
            return None

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.splitlines()[-lines:])

    def failures(self) -> dict[str, GuestResult]:
        return {k: r for k, r in self.results.items() if r.outcome in ("failed", "error")}


def _captured(text: str | None) -> bool:
    """Whether junit's system-out/err holds more than pytest's empty section headers."""
    lines = (text or "").splitlines()
    return any(line.strip() and not re.fullmatch(r"-+ Captured \w+ -+", line) for line in lines)


def parse_junit(path: Path) -> dict[str, GuestResult]:
    """Guest results keyed by junit_key(); an empty dict when the file is absent."""
    if not path.exists():
        return {}
    results: dict[str, GuestResult] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = f"{case.get('classname', '')}::{case.get('name', '')}"
        result = GuestResult("passed", seconds=float(case.get("time", "0") or 0))
        for child in case:
            if child.tag in ("failure", "error", "skipped") and result.outcome != "failed":
                result.outcome = {"failure": "failed"}.get(child.tag, child.tag)
                result.message = child.get("message", "")
                result.details = (child.text or "").strip()
        output = [
            f"--- guest {child.tag} ---\n{(child.text or '').strip()}"
            for child in case
            if child.tag in ("system-out", "system-err") and _captured(child.text)
        ]
        if output and result.outcome in ("failed", "error"):
            result.details = "\n".join([result.details, *output])
        results[key] = result
    return results


def guest_command(results_dir: Path, selected: list[str]) -> str:
    """The shell command the guest runs: pytest over the selected guest tests."""
    env = {
        IN_VM_ENV: "1",
        RESULTS_ENV: str(results_dir),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [
        guest_python(),
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfEs",
        "-o",
        "junit_logging=all",
        f"--junitxml={results_dir / 'junit.xml'}",
        "--basetemp=/tmp/plexus-vm",  # the guest's /tmp: a throwaway overlay in RAM
        _selection_arg(results_dir, selected),
    ]
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    uptime = shlex.quote(str(results_dir / "boot-seconds"))
    return (
        f"cut -d' ' -f1 /proc/uptime > {uptime}; "
        f"cd {shlex.quote(str(REPO))} && env {assigns} {shlex.join(argv)}"
    )


def _selection_arg(results_dir: Path, selected: list[str]) -> str:
    """The guest's test selection: the guest dir, or an @file of node ids.

    Ids go through a file (pytest reads `@file` arguments) because the command
    travels on the guest kernel's command line, whose length is limited: a long
    list there leaves the guest idle until the timeout.
    """
    if not selected:
        return str(GUEST_DIR.relative_to(REPO))
    listing = results_dir / "selected.txt"
    listing.write_text("\n".join(selected) + "\n")
    return f"@{listing}"


def vng_argv(results_dir: Path, command: str) -> list[str]:
    """The vng invocation: software emulation, one vCPU, 1 GiB, results shared read-write.

    One vCPU because QEMU's multi-threaded TCG can abort while the guest enables or
    removes igb VFs (`iotlb_to_section: Assertion ... failed`, seen with 2 vCPUs on
    QEMU 10.0): one vCPU thread cannot race the memory map it changes itself.
    """
    return [
        str(VNG_BIN / "vng"),
        "--disable-kvm",
        "--cpus",
        "1",
        "-m",
        "1G",
        f"--rwdir={results_dir}",
        "-r",
        f"/boot/vmlinuz-{kernel_version()}",
        f"--qemu-opts={QEMU_OPTS}",
        f"--append={GUEST_KERNEL_ARGS}",
        "--exec",
        command,
    ]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the VM: its process group is ours (start_new_session), qemu included."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # also reaches qemu if vng itself is gone
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.2)  # let the rest of the group exit before checking it is gone
    proc.wait()


def run_guest_suite(
    results_dir: Path, selected: list[str] | None = None, timeout: float = TIMEOUT
) -> GuestRun:
    """Boot once, run the guest tests, and always leave no VM behind.

    Under software emulation the guest occasionally wedges (seen in igb's sriov_numvfs
    writes and later in the SR-IOV tests): the console then stops growing although
    every guest test has a 120 s timeout. Such a run is killed early and booted again,
    up to STALL_RETRIES times; each wedged run's files are kept beside the new ones, as
    `<dir>-stalled<n>`, with the test it was in and the guest kernel's log.
    """
    start = time.monotonic()
    returncode, stalled = _boot(results_dir, selected or [], timeout)
    for attempt in range(1, STALL_RETRIES + 1):
        if not stalled:
            break
        results_dir.rename(results_dir.with_name(f"{results_dir.name}-stalled{attempt}"))
        returncode, stalled = _boot(results_dir, selected or [], timeout)
    return GuestRun(
        returncode=returncode,
        seconds=time.monotonic() - start,
        results_dir=results_dir,
        results=parse_junit(results_dir / "junit.xml"),
    )


def _boot(results_dir: Path, selected: list[str], timeout: float) -> tuple[int | None, bool]:
    """One VM run: its exit status (None if killed) and whether the guest stalled.

    The console goes through a pipe we copy into console.log: qemu reopens its stderr
    when it is killed, which would truncate a file it had been given directly.
    """
    results_dir.mkdir(parents=True, exist_ok=True)
    argv = vng_argv(results_dir, guest_command(results_dir, selected))
    env = {**os.environ, "PATH": f"{VNG_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    (results_dir / "vng-command.txt").write_text(shlex.join(argv) + "\n")
    console = results_dir / "console.log"
    returncode: int | None = None
    stalled = False
    with console.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        assert proc.stdout is not None
        copier = _ConsoleCopier(proc.stdout, log)
        copier.start()
        try:
            deadline = time.monotonic() + timeout
            while (returncode := proc.poll()) is None and time.monotonic() < deadline:
                if time.monotonic() - copier.last_output > STALL_SECONDS:
                    stalled = True
                    break
                time.sleep(2)
        finally:
            _stop(proc)
            copier.join(timeout=10)
    if returncode is None:
        why = f"no console output for {STALL_SECONDS:.0f} s" if stalled else f"{timeout:.0f} s"
        started = _last_line(results_dir / "progress.log")
        where = f"; the guest was in {started}" if started else ""
        with console.open("a") as log:
            log.write(f"\n*** VM killed: {why}{where} ***\n")
    return returncode, stalled


class _ConsoleCopier(threading.Thread):
    """Copies the VM's console into a file and notes when it last printed."""

    def __init__(self, source: IO[bytes], sink: IO[bytes]) -> None:
        super().__init__(name="vm-console", daemon=True)
        self.source, self.sink = source, sink
        self.last_output = time.monotonic()

    def run(self) -> None:
        fd = self.source.fileno()
        while chunk := os.read(fd, 65536):
            self.sink.write(chunk)
            self.sink.flush()
            self.last_output = time.monotonic()
        self.source.close()


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""
