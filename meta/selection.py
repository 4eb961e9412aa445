"""The `k8s.v1.cni.cncf.io/networks` pod annotation: which extra networks a pod asks for.

Two forms, as in Multus: a JSON list of selection objects when the value contains
`[`, `{` or `"`, otherwise comma-separated `[namespace/]name[@ifname]` entries.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cni import jsonio
from cni.config import NETWORK_NAME_RULE, valid_network_name
from cni.env import ifname_problem
from cni.errors import CNIError, ErrorCode
from cni.hwaddr import station_problem

NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_HW_ADDR_BYTES = (6, 8, 20)  # what Go's net.ParseMAC accepts: EUI-48, EUI-64, IPoIB


def _label_problem(what: str, value: str) -> str | None:
    if len(value) <= 63 and _DNS1123_LABEL.fullmatch(value):
        return None
    return f'{what} "{value}" is not a valid DNS-1123 label'


def _is_hw_addr(value: str) -> bool:
    """Colon/hyphen pairs or dotted quads of hex digits, 6, 8 or 20 bytes long."""
    for sep, width in ((":", 2), ("-", 2), (".", 4)):
        groups = value.split(sep)
        if len(groups) > 1 and all(re.fullmatch(f"[0-9a-fA-F]{{{width}}}", g) for g in groups):
            return len(groups) * width // 2 in _HW_ADDR_BYTES
    return False


def _is_ip(value: str) -> bool:
    if "%" in value:  # zoned addresses are not accepted by Multus
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _is_ip_or_cidr(value: str) -> bool:
    address, slash, prefix = value.partition("/")
    if not slash:
        return _is_ip(value)
    if not (_is_ip(address) and prefix.isascii() and prefix.isdigit()):
        return False
    try:
        ipaddress.ip_interface(value)
    except ValueError:
        return False
    return True


class NetworkSelection(BaseModel):
    """One element of the annotation: a NAD reference plus per-pod requests."""

    model_config = ConfigDict(populate_by_name=True, strict=True)

    name: str
    namespace: str
    interface: str | None = None
    ips: list[str] | None = None
    mac: str | None = None
    infiniband_guid: str | None = Field(default=None, alias="infiniband-guid")
    port_mappings: list[dict[str, Any]] | None = Field(default=None, alias="portMappings")
    bandwidth: dict[str, Any] | None = None
    cni_args: dict[str, Any] | None = Field(default=None, alias="cni-args")
    default_route: list[str] | None = Field(default=None, alias="default-route")
    device_id: str | None = Field(default=None, alias="deviceID")
    ipam_claim_reference: str | None = Field(default=None, alias="ipam-claim-reference")

    @property
    def ref(self) -> str:
        """`namespace/name` of the selected NetworkAttachmentDefinition."""
        return f"{self.namespace}/{self.name}"

    @model_validator(mode="before")
    @classmethod
    def _legacy_and_empty(cls, data: Any) -> Any:
        """Take the pre-3.2 `interfaceRequest`; an empty string means "not requested"."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        legacy = data.pop("interfaceRequest", None)
        if data.get("interface") in (None, ""):
            data["interface"] = None if legacy in (None, "") else legacy
        for key in ("mac", "infiniband-guid", "deviceID", "ipam-claim-reference"):
            if data.get(key) == "":
                data[key] = None
        return data

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value):
            raise ValueError(f'name "{value}" is not a valid DNS-1123 subdomain')
        return value

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str) -> str:
        if problem := _label_problem("namespace", value):
            raise ValueError(problem)
        return value

    @field_validator("interface")
    @classmethod
    def _check_interface(cls, value: str | None) -> str | None:
        if value is not None and (problem := ifname_problem(value)):
            raise ValueError(problem)
        return value

    @field_validator("ips")
    @classmethod
    def _check_ips(cls, value: list[str] | None) -> list[str] | None:
        for ip in value or []:
            if not _is_ip_or_cidr(ip):
                raise ValueError(f'ips: "{ip}" is not an IP address or CIDR')
        return value

    @field_validator("mac", "infiniband_guid")
    @classmethod
    def _check_hw_addr(cls, value: str | None, info: ValidationInfo) -> str | None:
        field = "mac" if info.field_name == "mac" else "infiniband-guid"
        if value is not None and not _is_hw_addr(value):
            raise ValueError(f'{field} "{value}" is not a valid hardware address')
        if value is not None and field == "mac" and (problem := station_problem(value)):
            raise ValueError(f"mac {problem}")
        return value

    @field_validator("ipam_claim_reference")
    @classmethod
    def _check_claim(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value)):
            raise ValueError(f'ipam-claim-reference "{value}" is not a valid IPAMClaim name')
        return value

    @model_validator(mode="after")
    def _claim_or_ips(self) -> NetworkSelection:
        """NPWG multi-net spec v1.3: an IPAMClaim gives the addresses, so `ips` may not."""
        if self.ipam_claim_reference is not None and self.ips:
            raise ValueError("ips and ipam-claim-reference may not be set together")
        return self

    @field_validator("default_route")
    @classmethod
    def _check_default_route(cls, value: list[str] | None) -> list[str] | None:
        for gateway in value or []:
            if not _is_ip(gateway):
                raise ValueError(f'default-route: "{gateway}" is not an IP address')
        return value


def parse_networks(
    value: str,
    default_namespace: str,
    origin: str = "networks annotation",
    limit: int | None = None,
) -> list[NetworkSelection]:
    """The selections in annotation `value`; namespaces default to `default_namespace`.

    `origin` names the annotation in errors. More than `limit` elements is an error
    (code 7) raised before any element is validated.
    """
    is_json = any(c in value for c in '[{"')
    items = _json_items(value, origin) if is_json else _text_items(value)
    if limit is not None and len(items) > limit:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"{origin} asks for {len(items)} networks; at most {limit} are allowed "
            "(maxNetworksPerPod)",
        )
    entries = _json_entries(items, origin) if is_json else _text_entries(items, origin)
    selections: list[NetworkSelection] = []
    owners: dict[str, int] = {}
    for position, label, data in entries:
        if data.get("namespace") in (None, ""):
            data["namespace"] = default_namespace
        try:
            selection = NetworkSelection.model_validate(data)
        except ValidationError as exc:
            raise _element_error(origin, position, label, _first_problem(exc)) from exc
        if selection.interface is not None:
            if selection.interface in owners:
                problem = (
                    f'interface "{selection.interface}" is also requested by '
                    f"element {owners[selection.interface]}"
                )
                raise _element_error(origin, position, label, problem)
            owners[selection.interface] = position
        selections.append(selection)
    return selections


def parse_network_ref(value: str, default_namespace: str) -> tuple[str, str]:
    """`(namespace, name)` of a `[namespace/]name` reference (clusterNetwork, defaultNetworks).

    The name may also be a CNI config name, so it is checked against the CNI
    network-name pattern rather than DNS-1123.
    """
    ref = value.strip()
    namespace, slash, name = ref.rpartition("/")
    if slash and not namespace:
        problem = "empty namespace"
    elif "/" in namespace:
        problem = 'more than one "/"'
    elif slash and (label := _label_problem("namespace", namespace)):
        problem = label
    elif not valid_network_name(name):
        problem = f'name "{name}" is not a valid network name ({NETWORK_NAME_RULE})'
    else:
        return namespace or default_namespace, name
    raise CNIError(ErrorCode.INVALID_CONFIG, f'network reference "{value}": {problem}')


_Entry = tuple[int, str, dict[str, Any]]


def _text_items(value: str) -> list[tuple[int, str]]:
    """Comma form: the non-blank elements, trimmed, with their positions."""
    items = [(position, raw.strip()) for position, raw in enumerate(value.split(","), start=1)]
    return [(position, item) for position, item in items if item]


def _text_entries(items: list[tuple[int, str]], origin: str) -> list[_Entry]:
    """Each `[namespace/]name[@ifname]`, namespace and name DNS-1123 labels."""
    entries: list[_Entry] = []
    for position, item in items:
        label = f'"{item}"'
        parts = item.split("/")
        at_parts = parts[-1].split("@")
        if len(parts) > 2:
            raise _element_error(origin, position, label, 'more than one "/"')
        if len(at_parts) > 2:
            raise _element_error(origin, position, label, 'more than one "@"')
        namespace = parts[0].strip() if len(parts) == 2 else ""
        name = at_parts[0].strip()
        problem = (namespace and _label_problem("namespace", namespace)) or (
            "name is empty" if not name else _label_problem("name", name)
        )
        if problem:
            raise _element_error(origin, position, label, problem)
        interface = at_parts[1].strip() if len(at_parts) == 2 else None
        entries.append(
            (position, label, {"name": name, "namespace": namespace, "interface": interface})
        )
    return entries


def _json_items(value: str, origin: str) -> list[Any]:
    data = jsonio.loads(value, origin)
    if not isinstance(data, list):
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"{origin}: expected a JSON list of objects, got {_json_type(data)}",
        )
    return data


def _json_entries(items: list[Any], origin: str) -> list[_Entry]:
    entries: list[_Entry] = []
    for position, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            problem = f"expected a JSON object, got {_json_type(item)}"
            raise _element_error(origin, position, json.dumps(item)[:60], problem)
        entries.append((position, _describe(item), dict(item)))
    return entries


def _describe(item: dict[str, Any]) -> str:
    name, namespace = item.get("name"), item.get("namespace")
    if not isinstance(name, str):
        return json.dumps(item, separators=(",", ":"))[:60]
    return f'"{namespace}/{name}"' if isinstance(namespace, str) and namespace else f'"{name}"'


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "boolean", dict: "object", list: "list", str: "string"}
    return names.get(type(value), "number")


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
    return f"{field[1:]}: {error['msg']}"


def _element_error(origin: str, position: int, label: str, problem: str) -> CNIError:
    return CNIError(ErrorCode.INVALID_CONFIG, f"{origin} element {position} ({label}): {problem}")
