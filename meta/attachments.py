"""From meta config, pod and NADs to the ordered list of delegates to attach.

Order (as Multus): the cluster network on CNI_IFNAME, then `defaultNetworks`,
then the pod's `k8s.v1.cni.cncf.io/networks` selections; unnamed interfaces
are `net<index>`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from cni import jsonio
from cni.config import NETWORK_NAME_RULE, valid_network_name, with_chained_plugins
from cni.errors import CNIError, ErrorCode
from cni.result import Result
from meta.config import MetaConfig
from meta.delegate import Delegate
from meta.devices import DeviceAllocator, DeviceSource
from meta.policy import HostPathPolicy, device_id_problem
from meta.selection import NETWORKS_ANNOTATION, NetworkSelection, parse_network_ref, parse_networks
from meta.sources.base import ClusterSource, NetworkAttachmentDefinition, Pod

DEFAULT_NETWORK_ANNOTATION = "v1.multus-cni.io/default-network"
CONF_SUFFIXES = (".conf", ".conflist", ".json")

# Selection field -> runtimeConfig capability it feeds.
_SELECTION_CAPABILITIES = {
    "ips": "ips",
    "mac": "mac",
    "infiniband_guid": "infinibandGUID",
    "port_mappings": "portMappings",
    "bandwidth": "bandwidth",
}
# Capabilities whose requests also travel in CNI_ARGS (IP=, MAC=), as Multus sends them.
_ALSO_IN_CNI_ARGS = frozenset({"ips", "mac"})


class NetworkNotFound(CNIError):
    """A referenced NAD or config file does not exist."""

    def __init__(self, ref: str, details: str = "") -> None:
        super().__init__(
            ErrorCode.INVALID_CONFIG,
            f"cannot find a network-attachment-definition ({ref})",
            details,
        )
        self.ref = ref


def parse_config_text(text: str, what: str) -> dict[str, Any]:
    """A conf or conflist from JSON text; `what` names it in errors."""
    return check_config(jsonio.loads(text, what), what)


def check_config(conf: Any, what: str) -> dict[str, Any]:
    """`conf` if it is a conf or conflist object; `what` names it in errors."""
    if not isinstance(conf, dict):
        raise CNIError(ErrorCode.INVALID_CONFIG, f"{what} must be a JSON object")
    if "type" not in conf and not isinstance(conf.get("plugins"), list):
        raise CNIError(
            ErrorCode.INVALID_CONFIG, f"{what} has neither a 'type' nor a 'plugins' list"
        )
    return conf


def find_conf_file(conf_dir: str, name: str) -> dict[str, Any] | None:
    """The first config file in `conf_dir` (sorted) whose `name` is `name`, with the
    plugins chained from `<conf_dir>/<name>/` (cni.config.with_chained_plugins)."""
    try:
        files = sorted(os.listdir(conf_dir))
    except OSError:
        return None
    for file in files:
        if not file.endswith(CONF_SUFFIXES):
            continue
        path = Path(conf_dir, file)
        try:
            conf = jsonio.loads(path.read_bytes(), f"config file {path}")
        except (OSError, CNIError):
            continue
        if isinstance(conf, dict) and conf.get("name") == name:
            return check_config(with_chained_plugins(conf, path), f"config file {path}")
    return None


def nad_config(nad: NetworkAttachmentDefinition, conf_dir: str) -> dict[str, Any]:
    """A NAD's spec.config, or the conf file of the same name when it is empty."""
    origin = f"network-attachment-definition {nad.namespace}/{nad.name}"
    if nad.config.strip():
        conf = parse_config_text(nad.config, f"{origin} spec.config")
    else:
        found = find_conf_file(conf_dir, nad.name)
        if found is None:
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"{origin} has no spec.config and no config named {nad.name!r} is in {conf_dir}",
            )
        conf = found
    conf.setdefault("name", nad.name)
    return conf


def declared_capabilities(config: dict[str, Any]) -> set[str]:
    """Capabilities any plugin of a conf or conflist declares."""
    plugins = config.get("plugins", [config])
    return {
        cap
        for plugin in plugins
        for cap, on in (plugin.get("capabilities") or {}).items()
        if on is True
    }


def _for_each_plugin(config: dict[str, Any]) -> list[dict[str, Any]]:
    return list(config["plugins"]) if "plugins" in config else [config]


def apply_selection(config: dict[str, Any], selection: NetworkSelection) -> dict[str, Any]:
    """The config with the selection's `cni-args`, `ipam-claim-reference` (in `args.cni`)
    and `deviceID` merged into every plugin."""
    config = copy.deepcopy(config)
    for plugin in _for_each_plugin(config):
        if selection.cni_args:
            args = plugin.setdefault("args", {})
            args.setdefault("cni", {}).update(selection.cni_args)
        if selection.ipam_claim_reference:  # how the IPAM learns it (docs/ipam.md)
            args = plugin.setdefault("args", {})
            args.setdefault("cni", {})["ipam-claim-reference"] = selection.ipam_claim_reference
    return inject_device_id(config, selection.device_id) if selection.device_id else config


def inject_device_id(config: dict[str, Any], device_id: str) -> dict[str, Any]:
    """The config with `deviceID` and `pciBusID` set in every plugin, as Multus does."""
    config = copy.deepcopy(config)
    for plugin in _for_each_plugin(config):
        plugin["deviceID"] = device_id
        plugin["pciBusID"] = device_id
    return config


def selection_capability_args(
    selection: NetworkSelection, network: str, config: dict[str, Any]
) -> dict[str, Any]:
    """Capability args the selection asks for; an error if neither runtimeConfig (no
    plugin declares the capability) nor CNI_ARGS (only `ips` and `mac`) can carry one."""
    wanted: dict[str, Any] = {}
    for field, cap in _SELECTION_CAPABILITIES.items():
        value = getattr(selection, field)
        if value:
            wanted[cap] = value
    declared = declared_capabilities(config)
    missing = sorted(set(wanted) - declared - _ALSO_IN_CNI_ARGS)
    if missing:
        raise CNIError(
            ErrorCode.UNSUPPORTED_FIELD,
            f"network {network}: the pod asks for {', '.join(missing)} but no plugin of the "
            f"network declares that capability",
            f"capabilities declared: {sorted(declared) or 'none'}",
        )
    # deviceID also goes into the config itself, so the capability is optional.
    if selection.device_id and "deviceID" in declared:
        wanted["deviceID"] = selection.device_id
    return wanted


def selection_cni_args(selection: NetworkSelection) -> list[tuple[str, str]]:
    """What Multus adds to CNI_ARGS for a selection: `MAC=`, `IP=` (the ips joined by
    commas) and `IgnoreUnknown=true`, so plugins that read neither still run."""
    pairs = [("MAC", selection.mac or ""), ("IP", ",".join(selection.ips or []))]
    wanted = [(key, value) for key, value in pairs if value]
    return [("IgnoreUnknown", "true"), *wanted] if wanted else []


def unhonoured_requests(delegate: Delegate, result: Result) -> list[str]:
    """The pod's `ips`/`mac` requests (sent in CNI_ARGS) that the ADD result does not show."""
    requests = dict(delegate.cni_args)
    problems = []
    wanted_ips = [ip.split("/")[0] for ip in requests.get("IP", "").split(",") if ip]
    got_ips = [str(ip.address.ip) for ip in result.ips]
    if missing := [ip for ip in wanted_ips if ip not in got_ips]:
        problems.append(f"ips {','.join(missing)} (got {','.join(got_ips) or 'none'})")
    mac = requests.get("MAC", "")
    got_mac = next(
        (i.mac for i in result.interfaces if i.name == delegate.ifname and i.sandbox), ""
    )
    if mac and got_mac and _hw_digits(mac) != _hw_digits(got_mac):
        problems.append(f"mac {mac} (got {got_mac})")
    return [
        f"network {delegate.network} ({delegate.ifname}): the pod asked for {problem}; no "
        "plugin of the network honoured it, in runtimeConfig or in CNI_ARGS"
        for problem in problems
    ]


def _hw_digits(mac: str) -> str:
    return "".join(c for c in mac.lower() if c in "0123456789abcdef")


class Resolver:
    """Turns a pod's request into delegates, reading NADs through the cluster source.

    With a device source, networks whose NAD has a `resourceName` get one of the pod's
    device IDs of that resource (see meta.devices); without one they get none.
    """

    def __init__(
        self,
        conf: MetaConfig,
        source: ClusterSource | None,
        ifname: str,
        devices: DeviceSource | None = None,
    ) -> None:
        self.conf = conf
        self.source = source
        self.ifname = ifname
        self.devices = devices
        self.policy = HostPathPolicy(conf.allowed_host_paths, conf.chroot_dir)

    def resolve(self, pod: Pod | None) -> list[Delegate]:
        """All delegates for the pod, in attach order, with unique interface names."""
        if self.source is None or pod is None:
            delegates = self._static_delegates()
        else:
            selections = self._selections(pod)
            allocator = None
            if self.devices is not None:
                reserved = [s.device_id for s in selections if s.device_id]
                allocator = DeviceAllocator(self.devices, pod, reserved)
            delegates = [self._cluster_delegate(pod)]
            if pod.namespace not in self.conf.system_namespaces:
                for ref in self.conf.default_networks:
                    delegates.append(self.named_delegate(ref, len(delegates)))
            for selection in selections:
                delegates.append(self._selected_delegate(pod, selection, len(delegates), allocator))
            if allocator is not None:
                _assign_devices(delegates, allocator)
        _check_unique_ifnames(delegates)
        _check_network_names(delegates)
        return delegates

    def _static_delegates(self) -> list[Delegate]:
        configs = list(self.conf.delegates) or [self._named_config(self.conf.cluster_network)[1]]
        delegates = []
        for index, config in enumerate(configs):
            name = str(config.get("name", f"delegate{index}"))
            delegates.append(
                Delegate(
                    network=name,
                    ifname=self.ifname if index == 0 else f"net{index}",
                    config=copy.deepcopy(config),
                    default=index == 0,
                    capability_args=dict(self.conf.runtime_config),
                )
            )
        return delegates

    def _cluster_delegate(self, pod: Pod) -> Delegate:
        """The pod's default network; named `namespace/name` when it comes from a NAD,
        else by its config's name, as Multus names it in network-status and events."""
        annotation = pod.annotations.get(DEFAULT_NETWORK_ANNOTATION, "").strip()
        if annotation:
            origin = f"the {DEFAULT_NETWORK_ANNOTATION} annotation of pod {_pod_ref(pod)}"
            selections = parse_networks(annotation, self.conf.multus_namespace, origin)
            if len(selections) != 1:
                raise CNIError(
                    ErrorCode.INVALID_CONFIG,
                    f"{DEFAULT_NETWORK_ANNOTATION} must name exactly one network, "
                    f"got {annotation!r}",
                )
            # The default network's NADs live in multusNamespace (Multus's rule), so an
            # unqualified name, which means that namespace, stays allowed.
            if selections[0].namespace != self.conf.multus_namespace:
                self._check_isolation(pod, selections[0])
            network, config, resource = self._named_config(selections[0].ref)
        elif self.conf.cluster_network:
            network, config, resource = self._named_config(self.conf.cluster_network)
        else:
            config = copy.deepcopy(self.conf.delegates[0])
            network, resource = str(config.get("name", "cluster")), ""
        return Delegate(
            network=network,
            ifname=self.ifname,
            config=config,
            default=True,
            capability_args=dict(self.conf.runtime_config),
            resource_name=resource,
        )

    def named_delegate(self, ref: str, index: int) -> Delegate:
        network, config, resource = self._named_config(ref)
        return Delegate(
            network=network,
            ifname=f"net{index}",
            config=config,
            capability_args=dict(self.conf.runtime_config),
            resource_name=resource,
        )

    def _named_config(self, ref: str) -> tuple[str, dict[str, Any], str]:
        """clusterNetwork / defaultNetworks entry: a NAD, a config file path, or a config name.

        Returns the network's name (`namespace/name` for a NAD, else the config's name),
        its config and its NAD's resourceName ("" if none).
        """
        if os.path.isabs(ref) and ref.endswith(CONF_SUFFIXES):
            try:
                raw = jsonio.loads(Path(ref).read_bytes(), f"config file {ref}")
            except OSError as exc:
                raise NetworkNotFound(ref, str(exc)) from exc
            if isinstance(raw, dict):
                raw = with_chained_plugins(raw, Path(ref))
            config = check_config(raw, f"config file {ref}")
            return str(config.get("name", ref)), config, ""
        if self.source is not None:
            namespace, name = parse_network_ref(ref, self.conf.multus_namespace)
            nad = self.source.get_nad(namespace, name)
            if nad is not None:
                config = self._nad_config(nad, f"{namespace}/{name}")
                return f"{namespace}/{name}", config, nad.resource_name or ""
        found = find_conf_file(self.conf.conf_dir, ref)
        if found is None:
            raise NetworkNotFound(ref, f"no NAD and no config of that name in {self.conf.conf_dir}")
        return ref, found, ""

    def _selections(self, pod: Pod) -> list[NetworkSelection]:
        value = pod.annotations.get(NETWORKS_ANNOTATION, "")
        if not value.strip():
            return []
        origin = f"the networks annotation of pod {_pod_ref(pod)}"
        selections = parse_networks(
            value, pod.namespace, origin, limit=self.conf.max_networks_per_pod
        )
        for selection in selections:
            self._check_isolation(pod, selection)
        return selections

    def _check_isolation(self, pod: Pod, selection: NetworkSelection) -> None:
        """namespaceIsolation: refuse a NAD outside the pod's and the global namespaces."""
        if not self.conf.namespace_allowed(pod.namespace, selection.namespace):
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"pod {_pod_ref(pod)} may not use network {selection.ref}: "
                "namespaceIsolation allows only its own namespace and globalNamespaces "
                f"({', '.join(self.conf.global_namespaces)})",
            )

    def _selected_delegate(
        self,
        pod: Pod,
        selection: NetworkSelection,
        index: int,
        allocator: DeviceAllocator | None,
    ) -> Delegate:
        assert self.source is not None
        nad = self.source.get_nad(selection.namespace, selection.name)
        if nad is None:
            raise NetworkNotFound(selection.ref, f"in namespace {selection.namespace}")
        _check_device(pod, selection, nad.resource_name or "", allocator)
        config = apply_selection(self._nad_config(nad, selection.ref), selection)
        caps = dict(self.conf.runtime_config)
        caps.update(selection_capability_args(selection, selection.ref, config))
        return Delegate(
            network=selection.ref,
            ifname=selection.interface or f"net{index}",
            ifname_chosen=bool(selection.interface),
            config=config,
            capability_args=caps,
            cni_args=selection_cni_args(selection),
            gateway_request=list(selection.default_route or []),
            resource_name=nad.resource_name or "",
            device_id=selection.device_id or "",
        )

    def _nad_config(self, nad: NetworkAttachmentDefinition, network: str) -> dict[str, Any]:
        """A NAD's config; its host paths checked unless the admin wrote it (a conf file
        in confDir, or a NAD in a system namespace the admin trusts)."""
        config = nad_config(nad, self.conf.conf_dir)
        trusted = not nad.config.strip() or (
            self.conf.trust_system_namespaces and nad.namespace in self.conf.system_namespaces
        )
        if not trusted:
            self.policy.check(config, network)
        return config


def _pod_ref(pod: Pod) -> str:
    return f"{pod.namespace}/{pod.name}"


def _check_device(
    pod: Pod, selection: NetworkSelection, resource: str, allocator: DeviceAllocator | None
) -> None:
    """A `deviceID` the pod names: a well-formed ID and, for a NAD with a resourceName,
    one of the devices of that resource allocated to this pod (checked where device IDs
    are looked up: on ADD)."""
    device_id = selection.device_id
    if not device_id:
        return
    if problem := device_id_problem(device_id):
        raise CNIError(ErrorCode.INVALID_CONFIG, f"network {selection.ref}: {problem}")
    if not resource or allocator is None:
        return
    allocated = allocator.allocated(resource)
    if device_id not in allocated:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"network {selection.ref}: deviceID {device_id} is not one of the {resource} "
            f"devices allocated to pod {_pod_ref(pod)} ({', '.join(allocated) or 'none'})",
            "a pod may name only a device the kubelet or a ResourceClaim gave it",
        )


def _assign_devices(delegates: list[Delegate], allocator: DeviceAllocator) -> None:
    """Give each network with a resource and no explicit deviceID the next device ID."""
    for delegate in delegates:
        if not delegate.resource_name or delegate.device_id:
            continue
        device_id = allocator.take(delegate.resource_name, delegate.network)
        delegate.device_id = device_id
        delegate.config = inject_device_id(delegate.config, device_id)
        if "deviceID" in declared_capabilities(delegate.config):
            delegate.capability_args["deviceID"] = device_id


def _check_network_names(delegates: list[Delegate]) -> None:
    """Refuse a config name that is not a CNI network name before any plugin runs:
    plugins and IPAM build paths from it (host-local's `<dataDir>/<name>`)."""
    for delegate in delegates:
        name = delegate.config.get("name")
        if isinstance(name, str) and not valid_network_name(name):
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"network {delegate.network}: its config's name {name!r} is not a valid CNI "
                f"network name ({NETWORK_NAME_RULE})",
            )


def _check_unique_ifnames(delegates: list[Delegate]) -> None:
    seen: dict[str, str] = {}
    for delegate in delegates:
        if delegate.ifname in seen:
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"interface {delegate.ifname} is requested by both {seen[delegate.ifname]} "
                f"and {delegate.network}",
            )
        seen[delegate.ifname] = delegate.network
