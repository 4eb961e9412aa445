"""From meta config, pod and NADs to the ordered list of delegates to attach.

Order (as Multus): the cluster network on CNI_IFNAME, then `defaultNetworks`,
then the pod's `k8s.v1.cni.cncf.io/networks` selections; unnamed interfaces
are `net<index>`.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from cni.errors import CNIError, ErrorCode
from meta.config import MetaConfig
from meta.delegate import Delegate
from meta.devices import DeviceAllocator, DeviceSource
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


class NetworkNotFound(CNIError):
    """A referenced NAD or config file does not exist."""

    def __init__(self, ref: str, details: str = "") -> None:
        super().__init__(
            ErrorCode.INVALID_CONFIG,
            f"cannot find a network-attachment-definition ({ref})",
            details,
        )
        self.ref = ref


def parse_config_text(text: str, origin: str) -> dict[str, Any]:
    """A conf or conflist from JSON text; `origin` names it in errors."""
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CNIError(
            ErrorCode.DECODE_FAILURE, f"{origin}: config is not valid JSON", str(exc)
        ) from exc
    if not isinstance(conf, dict):
        raise CNIError(ErrorCode.INVALID_CONFIG, f"{origin}: config must be a JSON object")
    if "type" not in conf and not isinstance(conf.get("plugins"), list):
        raise CNIError(
            ErrorCode.INVALID_CONFIG, f"{origin}: config has neither a 'type' nor a 'plugins' list"
        )
    return conf


def find_conf_file(conf_dir: str, name: str) -> dict[str, Any] | None:
    """The first config file in `conf_dir` (sorted) whose `name` is `name`."""
    try:
        files = sorted(os.listdir(conf_dir))
    except OSError:
        return None
    for file in files:
        if not file.endswith(CONF_SUFFIXES):
            continue
        path = os.path.join(conf_dir, file)
        try:
            conf = parse_config_text(Path(path).read_text(), path)
        except (OSError, CNIError):
            continue
        if conf.get("name") == name:
            return conf
    return None


def nad_config(nad: NetworkAttachmentDefinition, conf_dir: str) -> dict[str, Any]:
    """A NAD's spec.config, or the conf file of the same name when it is empty."""
    origin = f"network-attachment-definition {nad.namespace}/{nad.name}"
    if nad.config.strip():
        conf = parse_config_text(nad.config, origin)
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
    """The config with the selection's `cni-args` and `deviceID` merged into every plugin."""
    config = copy.deepcopy(config)
    for plugin in _for_each_plugin(config):
        if selection.cni_args:
            args = plugin.setdefault("args", {})
            args.setdefault("cni", {}).update(selection.cni_args)
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
    """Capability args the selection asks for; an error if no plugin can take one."""
    wanted: dict[str, Any] = {}
    for field, cap in _SELECTION_CAPABILITIES.items():
        value = getattr(selection, field)
        if value:
            wanted[cap] = value
    declared = declared_capabilities(config)
    missing = sorted(set(wanted) - declared)
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

    def resolve(self, pod: Pod | None) -> list[Delegate]:
        """All delegates for the pod, in attach order, with unique interface names."""
        if self.source is None or pod is None:
            delegates = self._static_delegates()
        else:
            selections = self._selections(pod)
            delegates = [self._cluster_delegate(pod)]
            if pod.namespace not in self.conf.system_namespaces:
                for ref in self.conf.default_networks:
                    delegates.append(self.named_delegate(ref, len(delegates)))
            for selection in selections:
                delegates.append(self._selected_delegate(pod, selection, len(delegates)))
            if self.devices is not None:
                reserved = [s.device_id for s in selections if s.device_id]
                _assign_devices(delegates, DeviceAllocator(self.devices, pod, reserved))
        _check_unique_ifnames(delegates)
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
        annotation = pod.annotations.get(DEFAULT_NETWORK_ANNOTATION, "").strip()
        if annotation:
            selections = parse_networks(annotation, self.conf.multus_namespace)
            if len(selections) != 1:
                raise CNIError(
                    ErrorCode.INVALID_CONFIG,
                    f"{DEFAULT_NETWORK_ANNOTATION} must name exactly one network, "
                    f"got {annotation!r}",
                )
            network, config, resource = self._named_config(selections[0].ref)
        elif self.conf.cluster_network:
            network, config, resource = self._named_config(self.conf.cluster_network)
        else:
            config = copy.deepcopy(self.conf.delegates[0])
            network, resource = str(config.get("name", "cluster")), ""
        return Delegate(
            network=str(config.get("name", network)),
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

        Returns the network's name, its config and its NAD's resourceName ("" if none).
        """
        if os.path.isabs(ref) and ref.endswith(CONF_SUFFIXES):
            try:
                return ref, parse_config_text(Path(ref).read_text(), ref), ""
            except OSError as exc:
                raise NetworkNotFound(ref, str(exc)) from exc
        if self.source is not None:
            namespace, name = parse_network_ref(ref, self.conf.multus_namespace)
            nad = self.source.get_nad(namespace, name)
            if nad is not None:
                config = nad_config(nad, self.conf.conf_dir)
                return f"{namespace}/{name}", config, nad.resource_name or ""
        found = find_conf_file(self.conf.conf_dir, ref)
        if found is None:
            raise NetworkNotFound(ref, f"no NAD and no config of that name in {self.conf.conf_dir}")
        return ref, found, ""

    def _selections(self, pod: Pod) -> list[NetworkSelection]:
        value = pod.annotations.get(NETWORKS_ANNOTATION, "")
        return parse_networks(value, pod.namespace) if value.strip() else []

    def _selected_delegate(self, pod: Pod, selection: NetworkSelection, index: int) -> Delegate:
        assert self.source is not None
        if not self.conf.namespace_allowed(pod.namespace, selection.namespace):
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"pod {pod.namespace}/{pod.name} may not use network {selection.ref}: "
                f"namespaceIsolation allows only its own namespace and "
                f"{self.conf.global_namespaces or 'no global namespaces'}",
            )
        nad = self.source.get_nad(selection.namespace, selection.name)
        if nad is None:
            raise NetworkNotFound(selection.ref, f"in namespace {selection.namespace}")
        config = apply_selection(nad_config(nad, self.conf.conf_dir), selection)
        caps = dict(self.conf.runtime_config)
        caps.update(selection_capability_args(selection, selection.ref, config))
        return Delegate(
            network=selection.ref,
            ifname=selection.interface or f"net{index}",
            ifname_chosen=bool(selection.interface),
            config=config,
            capability_args=caps,
            gateway_request=list(selection.default_route or []),
            resource_name=nad.resource_name or "",
            device_id=selection.device_id or "",
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
