"""A SriovNetwork rendered as the NetworkAttachmentDefinition the operator renders, byte for byte.

The operator fills a Go template whose `spec.config` is a single-quoted YAML scalar spread
over lines, then parses the YAML: each line break inside the scalar folds into a space (a
blank line into a newline) and each line's leading blanks go, which is what puts a space
after `{` and the chained plugins on their own lines. So the same text is built here and
folded by a YAML parser (`rendered` equals the operator's golden files). Its controller then
re-indents the JSON (Go's `json.Indent`, four spaces) before it writes the NAD, and so does
`nad`: a user's NADs do not change when they switch to Plexus. Optional fields appear in
the operator's order; `ipam` loses all its whitespace.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from cni import jsonio
from deviceplugin.provision.crs import GROUP, SriovNetwork

NAD_API_VERSION = "k8s.cni.cncf.io/v1"
RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
OWNER_ANNOTATION = "sriovnetwork.openshift.io/owner-ref"
STATES = ("auto", "enable", "disable")

Json = dict[str, Any]


class RenderError(ValueError):
    """The spec cannot be rendered (the operator's YAML step would fail as well)."""


def _sriov_fields(spec: Any) -> str:
    out = f'"type":"sriov","vlan":{spec.vlan},'
    if spec.spoof_chk in ("on", "off"):
        out += f'"spoofchk":"{spec.spoof_chk}",'
    if spec.trust in ("on", "off"):
        out += f'"trust":"{spec.trust}",'
    out += f'"vlanQoS":{spec.vlan_qos},'
    if spec.vlan_proto:
        out += f'"vlanProto":"{spec.vlan_proto}",'
    if spec.min_tx_rate is not None and spec.min_tx_rate >= 0:
        out += f'"min_tx_rate":{spec.min_tx_rate},'
    if spec.max_tx_rate is not None and spec.max_tx_rate >= 0:
        out += f'"max_tx_rate":{spec.max_tx_rate},'
    if spec.capabilities:
        out += f'"capabilities":{spec.capabilities},'
    if spec.link_state in STATES:
        out += f'"link_state":"{spec.link_state}",'
    if spec.log_level:
        out += f'"logLevel":"{spec.log_level}",'
    if spec.log_file:
        out += f'"logFile":"{spec.log_file}",'
    return out


def config_text(net: SriovNetwork) -> str:
    """The `spec.config` string."""
    spec = net.spec
    ipam = '"ipam":' + ("".join(spec.ipam.split()) if spec.ipam else "{}")
    head = f'{{\n  "cniVersion":"1.0.0",\n  "name":"{net.name}",'
    body = f"{_sriov_fields(spec)}{ipam}\n}}"
    if spec.meta_plugins:
        text = f'{head}"plugins": [\n    {{{body},\n  {spec.meta_plugins}\n  ]\n}}'
    else:
        text = head + body
    try:
        folded = yaml.safe_load(f"config: '{text}'\n")
    except yaml.YAMLError as exc:
        raise RenderError(
            f"SriovNetwork {net.namespace}/{net.name} cannot be rendered: {exc}"
        ) from None
    if not isinstance(folded, dict) or not isinstance(folded.get("config"), str):
        raise RenderError(f"SriovNetwork {net.namespace}/{net.name} cannot be rendered")
    return str(folded["config"])


def go_indent(text: str, indent: str = "    ") -> str:
    """Go's `json.Indent(dst, src, "", indent)`: the same tokens, one per line; `{}`, `[]`
    stay as they are; leading blanks go, trailing ones stay. RenderError if not JSON."""
    try:
        jsonio.loads(text, "the rendered config")  # bounded in size and depth first
        json.loads(text, parse_constant=_no_constant)  # Go refuses NaN and Infinity
    except ValueError as exc:
        raise RenderError(f"the rendered config is not JSON: {exc}") from None
    out: list[str] = []
    depth, i, pending = 0, 0, False  # pending: just opened, its first token decides
    body = text.lstrip(" \t\r\n")
    end = len(body.rstrip(" \t\r\n"))
    while i < end:
        c = body[i]
        if c in " \t\r\n":
            i += 1
            continue
        if pending:
            pending = False
            if c in "}]":
                out.append(c)
                depth -= 1
                i += 1
                continue
            out.append("\n" + indent * depth)
        if c == '"':
            j = i + 1
            while body[j] != '"':
                j += 2 if body[j] == "\\" else 1
            out.append(body[i : j + 1])
            i = j + 1
            continue
        if c in "{[":
            depth += 1
            pending = True
            out.append(c)
        elif c in "}]":
            depth -= 1
            out.append("\n" + indent * depth + c)
        elif c == ",":
            out.append(",\n" + indent * depth)
        elif c == ":":
            out.append(": ")
        else:
            out.append(c)
        i += 1
    return "".join(out) + body[end:]


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def target_namespace(net: SriovNetwork) -> str:
    return net.spec.network_namespace or net.namespace


def nad(net: SriovNetwork, prefix: str) -> Json:
    """The NetworkAttachmentDefinition as the operator's controller writes it to the API."""
    out = rendered(net, prefix)
    out["spec"]["config"] = go_indent(out["spec"]["config"])
    return out


def rendered(net: SriovNetwork, prefix: str) -> Json:
    """The operator's `RenderNetAttDef` (what its golden files hold)."""
    return {
        "apiVersion": NAD_API_VERSION,
        "kind": "NetworkAttachmentDefinition",
        "metadata": {
            "annotations": {
                RESOURCE_ANNOTATION: f"{prefix}/{net.spec.resource_name}",
                OWNER_ANNOTATION: f"SriovNetwork.{GROUP}/{net.namespace}/{net.name}",
            },
            "name": net.name,
            "namespace": target_namespace(net),
        },
        "spec": {"config": config_text(net)},
    }
