"""NodePrepareResources / NodeUnprepareResources for one claim.

Prepare takes the claim from the prefetched copies (claims.py) or else reads it from the
API, and checks that it is allocated (devices of our driver in pools of this node that
discovery knows) and reserved for a consumer; then it records the plan (state.py), binds
each VF to the driver its opaque config asks for (params.py, bind.py), writes the
claim's CDI spec (cdi.py) and returns the devices with their CDI IDs. A claim already in
the state is applied again from there, without asking the API: the bind is then a no-op
and the spec the same, so a kubelet retrying after a plugin restart gets the same
answer. Unprepare removes the spec, gives each VF its driver back and forgets the claim;
an unknown claim is already unprepared.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni.fileio import make_durable
from deviceplugin.allocate import env_name, uio_node, vfio_nodes
from deviceplugin.dra import bind, cdi
from deviceplugin.dra.claims import ClaimCache
from deviceplugin.dra.params import request_parameters
from deviceplugin.dra.slices import DRIVER
from deviceplugin.dra.state import PreparedClaim, PreparedDevice, PreparedState
from deviceplugin.sysfs import (
    USERSPACE_DRIVERS,
    VFIO_DRIVERS,
    PciNetDevice,
    device_dir,
    read_device,
)
from kube.api import APIError, KubeAPI

Json = dict[str, Any]


class PrepareError(RuntimeError):
    """A claim cannot be prepared (or unprepared); the message says why."""


def _ready(claim: Json, uid: str) -> bool:
    status = claim.get("status") or {}
    return (
        claim.get("metadata", {}).get("uid") == uid
        and bool(status.get("allocation"))
        and bool(status.get("reservedFor"))
    )


@dataclass(frozen=True)
class PoolDevice:
    """A device this node publishes: its pool's resource and what sysfs showed."""

    resource: str
    dev: PciNetDevice


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


class Preparer:
    """Prepares claims against the devices `devices()` returns (pool -> name -> device)."""

    def __init__(
        self,
        api: KubeAPI,
        state: PreparedState,
        cdi_dir: Path,
        sysfs_root: Path,
        dev_root: Path = Path("/dev"),
        claims: ClaimCache | None = None,
    ) -> None:
        self.api = api
        self.claims = claims
        self.state = state
        self.cdi_dir = cdi_dir
        self.sysfs_root = sysfs_root
        self.dev_root = dev_root
        self._devices: dict[str, dict[str, PoolDevice]] = {}
        self._lock = threading.Lock()  # one claim at a time: binds touch shared sysfs

    def set_devices(self, devices: Mapping[str, Mapping[str, PoolDevice]]) -> None:
        self._devices = {pool: dict(names) for pool, names in devices.items()}

    # -- prepare -----------------------------------------------------------------------

    def prepare(self, ref: ClaimRef) -> PreparedClaim:
        with self._lock:
            claim = self.state.get(ref.uid)
            unsynced = []
            if claim is None:
                claim = self.plan(ref, self._prefetched(ref) or self._get_claim(ref))
                rebinds = any(d.driver != d.driver_before for d in claim.devices)
                # Before a rebind the state must be on disk: it holds the driver to restore.
                path = self.state.put(claim, fsync=rebinds)
                if not rebinds:
                    unsynced.append(path)
            unsynced += self._apply(claim)
            make_durable(unsynced)  # the state and the spec in one go, before the answer
            return claim

    def _prefetched(self, ref: ClaimRef) -> Json | None:
        """The cache's copy, if it is one `_get_claim` would also have taken."""
        if self.claims is None:
            return None
        claim = self.claims.take(ref.namespace, ref.name, ref.uid)
        return claim if claim is not None and _ready(claim, ref.uid) else None

    def _get_claim(self, ref: ClaimRef) -> Json:
        """The claim, from the API server's watch cache (resourceVersion=0: ~2.5 ms less
        than a read from etcd); if that copy is not yet allocated and reserved for this
        UID, it may lag the scheduler's write, so a consistent read decides."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{ref.namespace}/resourceclaims/{ref.name}"
        try:
            claim = self.api.request("GET", f"{path}?resourceVersion=0")
            if not _ready(claim, ref.uid):
                claim = self.api.request("GET", path)
        except APIError as exc:
            raise PrepareError(f"claim {ref.namespace}/{ref.name}: GET failed: {exc}") from None
        except ConnectionError as exc:
            raise PrepareError(f"claim {ref.namespace}/{ref.name}: {exc}") from None
        if claim.get("metadata", {}).get("uid") != ref.uid:
            raise PrepareError(
                f"claim {ref.namespace}/{ref.name}: UID is not {ref.uid} (claim replaced)"
            )
        return claim

    def plan(self, ref: ClaimRef, claim: Json) -> PreparedClaim:
        """What preparing `claim` means here; raises PrepareError if it is not ours to prepare."""
        where = f"claim {ref.namespace}/{ref.name}"
        status = claim.get("status") or {}
        allocation = status.get("allocation")
        if not allocation:
            raise PrepareError(f"{where}: not allocated")
        if not status.get("reservedFor"):
            raise PrepareError(f"{where}: allocated but reserved for no one")
        devices_alloc = allocation.get("devices") or {}
        configs = devices_alloc.get("config") or []
        planned = []
        for result in devices_alloc.get("results") or []:
            if result.get("driver") != DRIVER:
                continue
            pool, name = result.get("pool", ""), result.get("device", "")
            request = str(result.get("request", ""))
            found = self._devices.get(pool, {}).get(name)
            if found is None:
                raise PrepareError(f"{where}: device {pool}/{name} is not on this node")
            params = request_parameters(configs, request)
            planned.append(
                PreparedDevice(
                    request=request,
                    pool=pool,
                    device=name,
                    address=found.dev.address,
                    resource=found.resource,
                    driver_before=found.dev.driver,
                    driver=params.driver or found.dev.driver,
                    cdi_id=cdi.CdiDevice(f"{ref.uid}-{name}", {}).cdi_id,
                )
            )
        return PreparedClaim(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            cdi_spec=str(cdi.spec_path(self.cdi_dir, ref.uid)),
            devices=planned,
        )

    def _apply(self, claim: PreparedClaim) -> list[Path]:
        """Bind and write the spec; returns the spec's path if it changed (to be synced)."""
        for device in claim.devices:
            if device.driver != device.driver_before:
                # A VF on a userspace driver has no known kernel driver: the kernel picks.
                before = device.driver_before
                native = "" if before in USERSPACE_DRIVERS else before
                bind.bind(self.sysfs_root, device.address, device.driver, native)
        spec = Path(claim.cdi_spec)
        return [spec] if cdi.write_spec(spec, self._cdi_devices(claim)) else []

    def _cdi_devices(self, claim: PreparedClaim) -> list[cdi.CdiDevice]:
        addresses: dict[tuple[str, str], list[str]] = {}
        for d in claim.devices:
            addresses.setdefault((d.request, d.resource), []).append(d.address)
        out = []
        for d in claim.devices:
            env = {env_name(d.resource): ",".join(addresses[(d.request, d.resource)])}
            out.append(cdi.CdiDevice(f"{claim.uid}-{d.device}", env, self._device_nodes(d)))
        return out

    def _device_nodes(self, d: PreparedDevice) -> tuple[str, ...]:
        """What a container needs of the VF in /dev: none for a netdevice."""
        if d.driver not in USERSPACE_DRIVERS:
            return ()
        dev = read_device(device_dir(d.address, self.sysfs_root))
        if d.driver in VFIO_DRIVERS:
            return vfio_nodes(dev, self.dev_root)
        uio = uio_node(dev, self.sysfs_root, self.dev_root)
        if not uio:
            raise PrepareError(f"{d.address}: bound to {d.driver} but has no uio node")
        return (uio,)

    # -- unprepare ---------------------------------------------------------------------

    def unprepare(self, uid: str) -> None:
        with self._lock:
            claim = self.state.get(uid)
            if claim is None:
                return
            cdi.remove_spec(Path(claim.cdi_spec))
            for device in claim.devices:
                if device.driver == device.driver_before or not device.driver_before:
                    continue
                if device.driver_before in USERSPACE_DRIVERS:
                    bind.bind(self.sysfs_root, device.address, device.driver_before)
                else:
                    bind.bind(self.sysfs_root, device.address, bind.NETDEVICE, device.driver_before)
            self.state.remove(uid)
