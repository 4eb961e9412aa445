"""Guest-side fixtures. These tests run only inside the VM booted by tests/vm/vm.py.

On the host every test here is skipped at collection (PLEXUS_IN_VM is unset), so none
of their fixtures run there. In the guest, as root: / is the host's, read-only, and so
is the repo; /tmp, /var, /etc, /usr and /opt are throwaway overlays over the host's
files and /run is a tmpfs, all in guest RAM (1 GiB); tmp_path lives under
/tmp/plexus-vm. The directory in PLEXUS_VM_RESULTS is the only one the host sees after.
Find the repo from `REPO` here (never a fixed path), and run Python as sys.executable.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni.env import CmdArgs
from cni.skel import dispatch
from delegates.sriov import SriovPlugin

IN_VM = os.environ.get("PLEXUS_IN_VM") == "1"
GUEST_DIR = Path(__file__).resolve().parent
REPO = GUEST_DIR.parents[2]
MODULES = ("ipvlan", "8021q", "dummy", "igbvf")
SKIP_REASON = "needs the VM kernel: runs via tests/vm/test_guest_suite.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IN_VM:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.path.is_relative_to(GUEST_DIR):
            item.add_marker(skip)


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Note each test as it starts in the results dir, so a wedged guest (no output at
    all) still tells the host which test it was in."""
    if IN_VM:
        with open(Path(os.environ["PLEXUS_VM_RESULTS"]) / "progress.log", "a") as log:
            log.write(nodeid + "\n")


@pytest.fixture(scope="session", autouse=True)
def kernel_log() -> Iterator[None]:
    """Follow the guest kernel's log into the results dir (hung-task reports included)."""
    path = Path(os.environ["PLEXUS_VM_RESULTS"]) / "dmesg.log"
    with path.open("w") as out:
        follow = subprocess.Popen(["dmesg", "--follow", "--ctime"], stdout=out, stderr=out)
        yield
        follow.terminate()
        follow.wait()


def sh(*cmd: str, netns: str = "", check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command (in `netns` if given); on failure the error shows its stderr."""
    full = ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)
    proc = subprocess.run(full, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(full)} -> {proc.returncode}: {proc.stderr.strip()}")
    return proc


@pytest.fixture(scope="session", autouse=True)
def guest_kernel() -> None:
    """Load the modules the other tiers need and make /run/netns usable."""
    sh("modprobe", "-a", *MODULES)
    run = Path("/run")
    if not os.access(run, os.W_OK):  # virtme mounts a tmpfs there; be sure of it
        sh("mount", "-t", "tmpfs", "tmpfs", str(run))
    (run / "netns").mkdir(exist_ok=True)


@pytest.fixture
def results_dir() -> Path:
    """Where a guest test may leave files for the host (shared via --rwdir)."""
    return Path(os.environ["PLEXUS_VM_RESULTS"])


@pytest.fixture
def netns() -> Iterator[Callable[[], str]]:
    """A factory of named network namespaces (lo up), deleted after the test."""
    made: list[str] = []

    def make() -> str:
        name = f"pxv-{uuid.uuid4().hex[:8]}"
        sh("ip", "netns", "add", name)
        made.append(name)
        sh("ip", "link", "set", "lo", "up", netns=name)
        return name

    yield make
    for name in made:
        sh("ip", "netns", "del", name, check=False)


@dataclass(frozen=True)
class Pf:
    """QEMU's igb SR-IOV PF: its PCI address, sysfs dir and netdev."""

    pci: str
    sysfs: Path
    netdev: str


IGB_PF = "0000:01:00.0"


@pytest.fixture
def igb_pf() -> Iterator[Pf]:
    """The igb PF with no VFs; any VFs a test creates are removed afterwards."""
    sysfs = Path("/sys/bus/pci/devices") / IGB_PF
    (netdev,) = (p.name for p in (sysfs / "net").iterdir())
    numvfs = sysfs / "sriov_numvfs"
    numvfs.write_text("0")
    yield Pf(IGB_PF, sysfs, netdev)
    numvfs.write_text("0")


NumVfs = list[tuple[str, str]]  # (PCI address, host netdev) of each VF


def host_netdev(pci: str) -> str:
    """The netdev name a PCI function has in this namespace, "" if none."""
    net = Path("/sys/bus/pci/devices") / pci / "net"
    names = os.listdir(net) if net.is_dir() else []
    return names[0] if names else ""


def enable_vfs(pf: Pf, count: int) -> NumVfs:
    """Enable `count` VFs; wait until udev has renamed their netdevs (ethN -> enp..vN).

    Names count as settled once none is ethN, or after 3 s without a change (TCG is slow).
    """
    (pf.sysfs / "sriov_numvfs").write_text(str(count))
    pcis = [os.path.basename(os.readlink(pf.sysfs / f"virtfn{n}")) for n in range(count)]
    deadline = time.monotonic() + 30
    names = [host_netdev(pci) for pci in pcis]
    stable_since = time.monotonic()
    while True:
        assert time.monotonic() < deadline, f"VF netdevs did not settle: {names}"
        time.sleep(0.2)
        now = [host_netdev(pci) for pci in pcis]
        if now != names:
            names, stable_since = now, time.monotonic()
        named = all(n and not n.startswith("eth") for n in names)
        if all(names) and (named or time.monotonic() - stable_since > 3):
            return list(zip(pcis, names, strict=True))


def pf_up(pf: Pf) -> None:
    """Set the PF up and wait for its (emulated, slightly late) link: VF health follows it."""
    sh("ip", "link", "set", pf.netdev, "up")
    operstate = pf.sysfs / "net" / pf.netdev / "operstate"
    deadline = time.monotonic() + 30
    while operstate.read_text().strip() != "up":
        assert time.monotonic() < deadline, "timed out waiting for the PF link"
        time.sleep(0.1)


def driver_of(pci: str) -> str:
    """The driver a PCI function is bound to, "" if none."""
    link = Path("/sys/bus/pci/devices") / pci / "driver"
    return os.path.basename(os.readlink(link)) if link.exists() else ""


def rebind(pci: str, driver: str) -> None:
    """Bind a VF to `driver` ("": its own kernel driver), as driverctl does."""
    dev = Path("/sys/bus/pci/devices") / pci
    (dev / "driver_override").write_text(driver or "\n")
    if (dev / "driver").exists():
        (dev / "driver" / "unbind").write_text(pci)
    Path("/sys/bus/pci/drivers_probe").write_text(pci)


@pytest.fixture
def vfs(igb_pf: Pf) -> Iterator[NumVfs]:
    """Two VFs, with the PF up: igb VFs have no link (and no rate limit) while it is down.
    Afterwards each VF is on its own driver again and the PF down."""
    pf_up(igb_pf)
    made = enable_vfs(igb_pf, 2)
    pf_up(igb_pf)  # igb resets the link when VFs are enabled
    yield made
    for pci, _ in made:
        if driver_of(pci) != "igbvf":
            rebind(pci, "")
    sh("ip", "link", "set", igb_pf.netdev, "down")


def sriov_conf(pci: str, data_dir: Path, **extra: Any) -> dict[str, Any]:
    """A `type: sriov` config for the VF `pci`, its state kept in `data_dir`."""
    base = {"cniVersion": "1.0.0", "name": "sriovnet", "type": "sriov", "deviceID": pci}
    return {**base, "dataDir": str(data_dir), **extra}


def sriov_call(
    command: str, conf: dict[str, Any], netns: str, ifname: str = "net1", cid: str = "c1"
) -> bytes:
    """One verb of the sriov plugin, in-process as the daemon runs it; what it prints."""
    args = CmdArgs(
        command=command,
        container_id=cid,
        netns=f"/run/netns/{netns}" if netns else "",
        ifname=ifname,
        args=(),
        path=("/usr/lib/cni",),
        stdin=json.dumps(conf).encode(),
    )
    return dispatch(SriovPlugin(), args)
