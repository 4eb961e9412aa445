"""The `plexus` command line: install-cni, uninstall-cni, daemon, cni (replay a call by
hand), inspect, deviceplugin."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meta.config import MetaConfig

DEFAULT_CNI_PATH = "/opt/cni/bin:/usr/lib/cni"
VERBS = ("add", "check", "del", "status", "gc", "version")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plexus", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    install = sub.add_parser("install-cni", help="install the plexus CNI binaries into a dir")
    install.add_argument("--bin-dir", default="/opt/cni/bin")
    install.add_argument(
        "--shim-only",
        action="store_true",
        help="only the shim (a DaemonSet install: the Python binaries cannot run on the host)",
    )

    uninstall = sub.add_parser(
        "uninstall-cni", help="remove Plexus's CNI config, binaries and state from a node"
    )
    uninstall.add_argument("--root", default="/", help="the node's / (e.g. /hostroot)")
    uninstall.add_argument("--bin-dir", default="/opt/cni/bin")
    uninstall.add_argument("--cni-conf", default="/etc/cni/net.d/00-plexus.conflist")
    uninstall.add_argument(
        "--state-dir",
        action="append",
        help="repeatable; default: /var/lib/cni/plexus and /run/plexus",
    )

    cni = sub.add_parser("cni", help="replay one CNI call by hand, as cnitool does")
    cni.add_argument("verb", choices=VERBS)
    cni.add_argument("--conf", required=True, help="a .conf or .conflist file")
    cni.add_argument("--netns", default="", help="network namespace path")
    cni.add_argument("--ifname", default="eth0")
    cni.add_argument("--container-id", default="", help="default: derived from --netns")
    cni.add_argument("--args", default="", help="CNI_ARGS, K=V;K=V")
    cni.add_argument("--cap-args", default="{}", help="capability args as a JSON object")
    cni.add_argument(
        "--valid", default="[]", help="gc: JSON list of [containerID, ifname] pairs to keep"
    )
    cni.add_argument("--path", default=os.environ.get("CNI_PATH", DEFAULT_CNI_PATH))
    cni.add_argument("--cache-dir", default="/var/lib/cni", help="libcni result cache root")

    daemon = sub.add_parser("daemon", help="run the node daemon the shim talks to")
    daemon.add_argument("--config", required=True, help="the daemon's config file (JSON)")
    daemon.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""))

    inspect = sub.add_parser(
        "inspect", help="this node's attachments against the kernel; exit 1 on problems"
    )
    inspect.add_argument(
        "--config", required=True, help="the plexus config (daemon config or 00-plexus.conflist)"
    )
    inspect.add_argument("--json", action="store_true", help="machine-readable output")

    dp = sub.add_parser(
        "deviceplugin",
        help="the SR-IOV device plugin: serve the kubelet, or `list` the pools",
        description="Without a subcommand: serve the kubelet device plugin API.",
    )
    dp.add_argument("--config", "--config-file", dest="config", help="the config.json")
    dp.add_argument("--sysfs-root", default="/sys")
    dp.add_argument("--plugins-dir", default="/var/lib/kubelet/device-plugins")
    dp.add_argument("--registry-dir", default="/var/lib/kubelet/plugins_registry")
    dp.add_argument(
        "--registration",
        choices=("kubelet", "watcher"),
        default="kubelet",
        help="Register on kubelet.sock (default) or via the kubelet's plugin watcher",
    )
    dp.add_argument("--devinfo-dir", default="/var/run/k8s.cni.cncf.io/devinfo")
    dra = dp.add_argument_group("DRA kubelet plugin (driver sriov.plexus.io)")
    dra.add_argument(
        "--dra-resources",
        default="",
        help="resources (prefix/name, comma-separated, or '*') served through DRA "
        "ResourceSlices instead of the device plugin API; empty: no DRA",
    )
    dra.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""))
    dra.add_argument("--kubeconfig", default="", help="empty: the in-cluster service account")
    dra.add_argument("--kubelet-plugins-dir", default="/var/lib/kubelet/plugins")
    dra.add_argument("--cdi-dir", default="/var/run/cdi")
    dra.add_argument("--dra-state-dir", default="/var/lib/plexus/dra")
    prov = dp.add_argument_group("SR-IOV provisioning (the sriov-network-operator's policies)")
    prov.add_argument(
        "--provision",
        action="store_true",
        help="create VFs, bind drivers and set MTUs from SriovNetworkNodePolicies, serve their "
        "pools, write this node's SriovNetworkNodeState (needs --node-name); --config optional",
    )
    prov.add_argument("--provision-namespace", default="sriov-network-operator")
    prov.add_argument("--resource-prefix", default="openshift.io")
    prov.add_argument("--provision-state-dir", default="/var/lib/plexus/sriov")
    prov.add_argument(
        "--pod-resources-socket", default="/var/lib/kubelet/pod-resources/kubelet.sock"
    )
    dp_sub = dp.add_subparsers(dest="dp_command")
    dp_list = dp_sub.add_parser("list", help="print the resource pools the config selects")
    dp_list.add_argument("--config", "--config-file", dest="config", default=argparse.SUPPRESS)
    dp_list.add_argument("--sysfs-root", default=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command in ("install-cni", "uninstall-cni"):
        sys.exit(install_files(args))
    elif args.command == "cni":
        sys.exit(replay(args))
    elif args.command == "daemon":
        from cni.errors import CNIError
        from meta.daemon.main import run_daemon

        try:
            sys.exit(run_daemon(args.config, args.node_name))
        except CNIError as exc:
            sys.exit(f"plexus daemon: {exc}")
    elif args.command == "inspect":
        sys.exit(inspect_node(args.config, args.json))
    elif args.command == "deviceplugin":
        if not args.config and not (args.provision and args.dp_command != "list"):
            sys.exit("plexus deviceplugin: --config is required")
        from deviceplugin import cli as dp_cli

        if args.dp_command == "list":
            sys.exit(dp_cli.list_pools(args.config, args.sysfs_root))
        kubelet = None
        if args.provision:
            from meta.podresources.client import PodResourcesClient

            kubelet = PodResourcesClient(args.pod_resources_socket).allocations
        sys.exit(dp_cli.serve(args, kubelet))


def install_files(args: argparse.Namespace) -> int:
    """install-cni or uninstall-cni; prints each path written or removed."""
    from cni.errors import CNIError
    from meta import install

    try:
        if args.command == "install-cni":
            done = install.install_binaries(args.bin_dir, shim_only=args.shim_only)
        else:
            states = args.state_dir or ["/var/lib/cni/plexus", "/run/plexus"]
            done = install.uninstall(args.root, args.bin_dir, args.cni_conf, states)
    except (OSError, CNIError) as exc:
        print(f"plexus {args.command}: {exc}", file=sys.stderr)
        return 1
    verb = "installed" if args.command == "install-cni" else "removed"
    for path in done:
        print(f"{verb} {path}")
    return 0


def inspect_node(config_file: str, as_json: bool) -> int:
    """Print the node report; 0 when healthy, 1 with problems, 2 on a bad config."""
    from cni.errors import CNIError
    from meta import inspection

    try:
        conf = load_node_config(config_file)
    except (OSError, ValueError, CNIError) as exc:
        print(f"plexus inspect: {config_file}: {exc}", file=sys.stderr)
        return 2
    report = inspection.inspect_node(conf)
    print(inspection.to_json(report) if as_json else inspection.render(report))
    return 0 if report.healthy else 1


def load_node_config(config_file: str) -> MetaConfig:
    """The plexus config in a conflist (00-plexus.conflist), or a daemon config file."""
    from cni import jsonio
    from cni.config import load_network_config, plugin_stdin
    from cni.errors import CNIError, ErrorCode
    from meta.config import load_meta_config
    from meta.daemon.config import load_daemon_config

    data = Path(config_file).read_bytes()
    raw = jsonio.loads(data, config_file)
    if not (isinstance(raw, dict) and "plugins" in raw):
        return load_daemon_config(config_file)
    net = load_network_config(data)
    for plugin in net.plugins:
        if plugin["type"] in ("plexus", "plexus-thin"):
            return load_meta_config(plugin_stdin(net, plugin, {}, None))
    raise CNIError(ErrorCode.INVALID_CONFIG, f"no plexus plugin in network {net.name!r}")


def replay(args: argparse.Namespace) -> int:
    """Run one verb of a network config through its plugins and print the outcome."""
    from cni import logs
    from cni.config import load_network_config
    from cni.env import parse_cni_args
    from cni.errors import CNIError
    from cni.invoke import ExecExecutor, version_info
    from cni.runtime import CNIRuntime, RuntimeConf

    logs.configure("debug", "", True)
    paths = [p for p in args.path.split(os.pathsep) if p]
    try:
        net = load_network_config(Path(args.conf).read_bytes())
        runtime = CNIRuntime(paths, args.cache_dir)
        container_id = args.container_id or _container_id(args.netns)
        rt = RuntimeConf(
            container_id,
            args.netns,
            args.ifname,
            parse_cni_args(args.args),
            _json_object(args.cap_args),
        )
        output: Any = None
        if args.verb == "add":
            output = runtime.add(net, rt).to_dict(net.cni_version)
        elif args.verb == "check":
            runtime.check(net, rt)
        elif args.verb == "del":
            runtime.delete(net, rt)
        elif args.verb == "status":
            runtime.status(net)
        elif args.verb == "gc":
            valid = json.loads(args.valid)  # the operator's command line, as --cap-args
            runtime.gc(net, [(str(c), str(i)) for c, i in valid])
        else:
            output = {
                p["type"]: version_info(ExecExecutor(), p["type"], paths) for p in net.plugins
            }
    except CNIError as exc:
        print(json.dumps(exc.to_dict("1.1.0"), indent=2))
        return 1
    except (OSError, ValueError) as exc:
        print(f"plexus cni: {exc}", file=sys.stderr)
        return 2
    if output is not None:
        print(json.dumps(output, indent=2))
    print(
        f"{args.verb.upper()} of {net.name} for {container_id}/{args.ifname}: ok", file=sys.stderr
    )
    return 0


def _container_id(netns: str) -> str:
    # Like cnitool: a stable ID per namespace path.
    return "cnitool-" + hashlib.sha512(netns.encode()).hexdigest()[:20]


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)  # the root operator's own command line, not tenant input
    if not isinstance(value, dict):
        raise ValueError("--cap-args must be a JSON object")
    return value
