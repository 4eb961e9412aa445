"""`plexus deviceplugin ...`: serve the kubelet, or print what would be offered."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from cni import logs
from cni.errors import CNIError
from deviceplugin.config import ConfigError, DevicePluginConfig, load_config
from deviceplugin.dra.plugin import DraOptions, DraPlugin
from deviceplugin.plugin import DevicePluginRunner, PluginOptions
from deviceplugin.provision.holders import KubeletDevices
from deviceplugin.provision.record import RecordError
from deviceplugin.selectors import pools_report
from deviceplugin.server import HostPaths, ServeError
from deviceplugin.sysfs import DEFAULT_SYSFS, default_route_ifaces, discover


def list_pools(config_file: str, sysfs_root: str = DEFAULT_SYSFS) -> int:
    """Print the resource pools as JSON; config errors are one line on stderr, exit 2."""
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        print(f"plexus deviceplugin: {exc}", file=sys.stderr)
        return 2
    devices = discover(sysfs_root, default_route_ifaces())
    print(json.dumps(pools_report(config, devices), indent=2))
    return 0


def serve(args: argparse.Namespace, kubelet_devices: KubeletDevices | None = None) -> int:
    """Run the device plugin (and with --provision the SR-IOV agent feeding it) until
    SIGTERM/SIGINT; config errors exit 2. `kubelet_devices` lists the kubelet's allocations."""
    provision = bool(getattr(args, "provision", False))
    if provision and not args.node_name:
        print("plexus deviceplugin: --provision needs --node-name (or NODE_NAME)", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config) if args.config else DevicePluginConfig(resource_list=[])
    except ConfigError as exc:
        print(f"plexus deviceplugin: {exc}", file=sys.stderr)
        return 2
    logs.configure("info", "", to_stderr=True)
    options = PluginOptions(
        paths=HostPaths(args.sysfs_root, "/dev", args.devinfo_dir),
        plugins_dir=Path(args.plugins_dir),
        registry_dir=Path(args.registry_dir),
        mode=args.registration,
    )
    dra = None
    resources = frozenset(r.strip() for r in args.dra_resources.split(",") if r.strip())
    if resources:
        if not args.node_name:
            print("plexus deviceplugin: DRA needs --node-name (or NODE_NAME)", file=sys.stderr)
            return 2
        try:
            dra = DraPlugin(
                DraOptions(
                    node_name=args.node_name,
                    resources=resources,
                    kubeconfig=args.kubeconfig,
                    kubelet_plugins_dir=Path(args.kubelet_plugins_dir),
                    cdi_dir=Path(args.cdi_dir),
                    state_dir=Path(args.dra_state_dir),
                    devinfo_dir=args.devinfo_dir,
                ),
                registry_dir=Path(args.registry_dir),
                sysfs_root=Path(args.sysfs_root),
                dev_root=Path("/dev"),
            )
        except CNIError as exc:
            print(f"plexus deviceplugin: {exc}", file=sys.stderr)
            return 2
    runner = DevicePluginRunner(config, options, dra)
    agent = None
    if provision:
        from deviceplugin.provision.service import provisioning_agent

        agent = provisioning_agent(args, runner, config, kubelet_devices)
        try:
            agent.boot()  # the recorded VFs exist before anything is served
        except (RecordError, OSError) as exc:
            print(f"plexus deviceplugin: {exc}", file=sys.stderr)
            return 2
        agent.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: runner.stop())
    try:
        runner.run()
    except ServeError as exc:
        print(f"plexus deviceplugin: {exc}", file=sys.stderr)
        return 1
    finally:
        if agent is not None:
            agent.stop()
    return 0
