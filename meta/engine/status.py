"""STATUS: is the node ready for pods, as far as its networks can tell."""

from __future__ import annotations

from cni.env import CmdArgs
from cni.errors import CNIError
from meta.engine.core import Core, call_log


def status(core: Core, args: CmdArgs) -> None:
    """Ready when the default network is; secondary problems are only logged."""
    log = call_log("status", args)
    delegates = core.static_networks()
    default = delegates[0]
    with log.step("default network status", network=default.network, delegate=default.chain):
        core.runtime.status(default.network_config())
    for delegate in delegates[1:]:
        try:
            core.runtime.status(delegate.network_config())
        except CNIError as exc:
            log.warning(
                "secondary network not ready (node stays Ready)",
                network=delegate.network,
                error=str(exc),
            )
