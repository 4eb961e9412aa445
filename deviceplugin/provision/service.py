"""`plexus deviceplugin --provision`: the agent wired to the device plugin that serves its pools.

The device plugin's resources are then the policies', then those of a `--config` file if one
is given: a device goes to the first resource that selects it, so a policy's exact VFs are
never taken by a broad `config.json` selector, and `config.json` keeps its names (a policy
resource of the same name is not served). The agent boots (the recorded
configs applied) before the device plugin serves, so after a reboot nothing is advertised
before its VFs exist; its pools reach the device plugin through `set_config`, and each of
the device plugin's scans tells the agent when PFs or VFs changed.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from deviceplugin.config import DevicePluginConfig, ResourceConfig
from deviceplugin.plugin import DevicePluginRunner
from deviceplugin.provision.agent import ProvisionAgent, ProvisionOptions
from deviceplugin.provision.holders import AllocationReader, KubeletDevices
from deviceplugin.provision.host import Host
from deviceplugin.provision.node import NodeProvisioner
from deviceplugin.provision.record import Records
from kube.api import KubeAPI

log = logging.getLogger("plexus.provision")


def provisioning_agent(
    args: argparse.Namespace,
    runner: DevicePluginRunner,
    static: DevicePluginConfig,
    kubelet_devices: KubeletDevices | None,
) -> ProvisionAgent:
    """The agent for `args`, feeding `runner`; call `boot` then `start` before serving."""
    taken = {r.full_name for r in static.resource_list}

    def publish(resources: list[ResourceConfig]) -> None:
        clash = [r.full_name for r in resources if r.full_name in taken]
        if clash:
            log.error("resources %s are in --config already: the policies' are not served", clash)
        mine = [r for r in resources if r.full_name not in taken]
        runner.set_config(DevicePluginConfig(resource_list=[*mine, *static.resource_list]))

    options = ProvisionOptions(
        node_name=args.node_name,
        namespace=args.provision_namespace,
        resource_prefix=args.resource_prefix,
        state_dir=Path(args.provision_state_dir),
    )
    dra_state = Path(args.dra_state_dir) if runner.dra is not None else None
    provisioner = NodeProvisioner(
        Host(Path(args.sysfs_root)),
        Records(options.state_dir),
        AllocationReader(kubelet_devices, dra_state),
        options.resource_prefix,
    )
    agent = ProvisionAgent(KubeAPI(args.kubeconfig), options, provisioner, publish)
    runner.on_scan.append(agent.devices_seen)
    return agent
