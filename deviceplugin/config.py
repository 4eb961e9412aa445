"""The device plugin's `config.json`, in the sriov-network-device-plugin format.

    {"resourceList": [{"resourceName": "sriov_a", "resourcePrefix": "intel.com",
                       "deviceType": "netDevice", "selectors": [{"vendors": ["8086"]}]}]}

`selectors` is a list of selector objects (a device matches when it satisfies every key
of one object); a single object, as older configs have it, is read as a list of one.
Errors raise `ConfigError` naming the offending field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cni import jsonio

DEFAULT_PREFIX = "intel.com"  # the DP's --resource-prefix default
_HEX_ID = re.compile(r"^[0-9a-fA-F]{4}$")
# The operator also allows inner dashes (`net-device-1`), which the kubelet accepts.
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?$")
_PREFIX = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
_VF_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class ConfigError(ValueError):
    """The device plugin config is not valid; the message names the field."""


def parse_vf_spec(spec: str) -> tuple[str, frozenset[int] | None]:
    """Split `name#0-3,7` into ("name", {0, 1, 2, 3, 7}); without `#` the set is None."""
    name, sep, ranges = spec.partition("#")
    if not name:
        raise ValueError(f"{spec!r}: empty name before '#'")
    if not sep:
        return name, None
    indexes: set[int] = set()
    for part in ranges.split(","):
        match = _VF_RANGE.match(part.strip())
        if not match:
            raise ValueError(f"{spec!r}: bad VF range {part!r} (want N or N-M)")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise ValueError(f"{spec!r}: VF range {part!r} ends before it starts")
        indexes.update(range(first, last + 1))
    return name, frozenset(indexes)


class NetDeviceSelector(BaseModel):
    """One selector object for `deviceType: netDevice`; its keys are ANDed."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    vendors: list[str] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list)
    drivers: list[str] = Field(default_factory=list)
    pci_addresses: list[str] = Field(default_factory=list, alias="pciAddresses")
    acpi_indexes: list[str] = Field(default_factory=list, alias="acpiIndexes")
    pf_names: list[str] = Field(default_factory=list, alias="pfNames")
    root_devices: list[str] = Field(default_factory=list, alias="rootDevices")
    link_types: list[str] = Field(default_factory=list, alias="linkTypes")
    is_rdma: bool = Field(default=False, alias="isRdma")
    need_vhost_net: bool = Field(default=False, alias="needVhostNet")
    vdpa_type: Literal["", "vhost", "virtio"] = Field(default="", alias="vdpaType")

    @field_validator("vendors", "devices")
    @classmethod
    def _hex_ids(cls, value: list[str]) -> list[str]:
        for item in value:
            if not _HEX_ID.match(item):
                raise ValueError(f"{item!r} is not a 4-digit hex PCI id (like '8086')")
        return [item.lower() for item in value]

    @field_validator("pci_addresses", "root_devices")
    @classmethod
    def _lower(cls, value: list[str]) -> list[str]:
        return [item.lower() for item in value]

    @field_validator("pf_names", "root_devices")
    @classmethod
    def _vf_specs(cls, value: list[str]) -> list[str]:
        for item in value:
            parse_vf_spec(item)
        return value

    @field_validator("link_types")
    @classmethod
    def _link_types(cls, value: list[str]) -> list[str]:
        return [item.lower() for item in value]


class ResourceConfig(BaseModel):
    """One entry of `resourceList`: a named pool and the selectors that fill it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    resource_name: str = Field(alias="resourceName")
    resource_prefix: str = Field(default=DEFAULT_PREFIX, alias="resourcePrefix")
    device_type: Literal["netDevice"] = Field(default="netDevice", alias="deviceType")
    exclude_topology: bool = Field(default=False, alias="excludeTopology")
    additional_info: dict[str, dict[str, str]] = Field(default_factory=dict, alias="additionalInfo")
    selectors: list[NetDeviceSelector] = Field(min_length=1)

    @field_validator("resource_name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _RESOURCE_NAME.match(value):
            raise ValueError(f"{value!r}: use only letters, digits, '_' and inner '-'")
        return value

    @field_validator("resource_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not _PREFIX.match(value):
            raise ValueError(f"{value!r} is not a DNS-style prefix (like 'intel.com')")
        return value

    @field_validator("selectors", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @property
    def full_name(self) -> str:
        return f"{self.resource_prefix}/{self.resource_name}"


class DevicePluginConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    resource_list: list[ResourceConfig] = Field(alias="resourceList")


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "config"


def parse_config(data: bytes | str) -> DevicePluginConfig:
    """Parse and validate a config document; raises ConfigError."""
    try:
        raw = jsonio.loads(data, "device plugin config")
    except jsonio.DecodeError as exc:
        raise ConfigError(exc.msg) from None
    if not isinstance(raw, dict):
        raise ConfigError("device plugin config must be a JSON object with 'resourceList'")
    try:
        config = DevicePluginConfig.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown or unsupported field"
            problems.append(f"{_location(err['loc'])}: {msg}")
        raise ConfigError("invalid device plugin config: " + "; ".join(problems)) from None
    seen: set[str] = set()
    for i, res in enumerate(config.resource_list):
        if res.full_name in seen:
            raise ConfigError(
                f"invalid device plugin config: resourceList[{i}].resourceName: "
                f"{res.full_name} is defined twice"
            )
        seen.add(res.full_name)
    return config


def load_config(path: str | Path) -> DevicePluginConfig:
    """Read and validate a config file; raises ConfigError (also when unreadable)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read device plugin config {path}: {exc.strerror}") from None
    return parse_config(data)
