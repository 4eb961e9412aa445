"""One attachment the meta-plugin makes: a network config bound to an interface."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from cni.config import NetworkConfigList, load_network_config

_PARSED_LIMIT = 256
_parsed: dict[int, tuple[dict[str, Any], NetworkConfigList]] = {}
"""Parsed configs by the id of their dict, which each entry keeps alive (so no other
dict takes that id while the entry is there)."""


class Delegate(BaseModel):
    """A network to attach, ready to run; persisted in the attachment record."""

    network: str = Field(description="name in network-status: ns/name, or the config's name")
    ifname: str
    ifname_chosen: bool = Field(False, description="the pod asked for this name; else netN")
    config: dict[str, Any] = Field(description="the conf or conflist to run, fully resolved")
    default: bool = False
    capability_args: dict[str, Any] = Field(default_factory=dict)
    cni_args: list[tuple[str, str]] = Field(
        default_factory=list, description="CNI_ARGS pairs for this attachment only (IP=, MAC=)"
    )
    gateway_request: list[str] = Field(default_factory=list)
    resource_name: str = Field("", description="the NAD's device-plugin resource, if any")
    device_id: str = Field("", description="the device given to this attachment, if any")
    device_info: dict[str, Any] | None = None

    @property
    def config_bytes(self) -> bytes:
        return json.dumps(self.config, separators=(",", ":")).encode()

    def network_config(self) -> NetworkConfigList:
        """The config as the protocol layer runs it, parsed once per config object (a
        call asks 3-4 times per network; configs are replaced, never changed in place)."""
        kept = _parsed.get(id(self.config))
        if kept is not None and kept[0] is self.config:
            return kept[1]
        net = load_network_config(self.config_bytes)
        if len(_parsed) >= _PARSED_LIMIT:
            _parsed.clear()
        _parsed[id(self.config)] = (self.config, net)
        return net

    def runtime_args(self, args: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """The runtime's CNI_ARGS with this attachment's own pairs replacing theirs."""
        if not self.cni_args:
            return args
        own = {key for key, _ in self.cni_args}
        return tuple(pair for pair in args if pair[0] not in own) + tuple(self.cni_args)

    @property
    def plugins(self) -> list[dict[str, Any]]:
        """The plugin confs in chain order (a single conf is a chain of one)."""
        chain = self.config.get("plugins")
        if not isinstance(chain, list):
            return [self.config]
        return [p for p in chain if isinstance(p, dict)]

    @property
    def plugin_types(self) -> list[str]:
        return [str(p.get("type", "")) for p in self.plugins]

    @property
    def links_in_pod(self) -> bool:
        """A plugin hangs its link from one inside the pod (`linkInContainer`), which an
        earlier network may be the one to create."""
        return any(p.get("linkInContainer") for p in self.plugins)

    @property
    def chain(self) -> str:
        """The plugin types, e.g. `macvlan+tuning`."""
        return "+".join(self.plugin_types)

    @property
    def log_fields(self) -> dict[str, str]:
        """How log lines name this attachment."""
        return {"network": self.network, "ifname": self.ifname, "delegate": self.chain}

    @property
    def label(self) -> str:
        """How logs and errors name this attachment."""
        return f"{self.network} ({self.ifname}, {self.chain})"
