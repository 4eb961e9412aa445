"""The opaque configuration a claim (or its DeviceClass) gives our driver.

    config: [{requests: [vf], opaque: {driver: sriov.plexus.io,
                                       parameters: {driver: vfio-pci}}}]

`parameters.driver` is the kernel driver the VF is bound to while the claim holds it:
`netdevice` (the VF's own kernel driver, as the kernel probes it), `vfio-pci`,
`uio_pci_generic` or `igb_uio`; absent, the VF keeps whatever driver it has. Configs
from the class come first, then the claim's; later ones win, key by key. Errors raise
ConfigError naming the entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from deviceplugin.config import ConfigError
from deviceplugin.dra.slices import DRIVER

Binding = Literal["netdevice", "vfio-pci", "uio_pci_generic", "igb_uio"]


class VfParameters(BaseModel):
    """`parameters` of one opaque config entry for our driver."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: str = ""  # accepted for kubectl-style objects, not interpreted
    kind: str = ""
    driver: Binding | None = None


def request_parameters(configs: Sequence[dict[str, Any]], request: str) -> VfParameters:
    """The merged parameters for one request of a claim's `status.allocation.devices.config`."""
    merged: dict[str, Any] = {}
    # Class configs first (a stable sort keeps each group's order); indexes stay the claim's.
    ordered = sorted(enumerate(configs), key=lambda item: item[1].get("source") != "FromClass")
    for index, entry in ordered:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != DRIVER:
            continue
        requests = entry.get("requests") or []
        # `req/sub` names a subrequest of `req` (prioritized lists): it applies to `req`.
        if requests and request not in requests and request.split("/")[0] not in requests:
            continue
        params = opaque.get("parameters")
        if not isinstance(params, dict):
            raise ConfigError(f"config[{index}].opaque.parameters: must be a JSON object")
        try:
            VfParameters.model_validate(params)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(f"config[{index}].opaque.parameters: {problems}") from None
        merged.update(params)
    return VfParameters.model_validate(merged)
