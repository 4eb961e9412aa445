"""`ipam-claim-reference` in a network selection (NPWG multi-net spec v1.3)."""

from __future__ import annotations

import pytest

from cni.errors import CNIError
from meta.attachments import apply_selection
from meta.selection import parse_networks


def test_a_claim_reference_reaches_every_plugin_in_args_cni() -> None:
    (selection,) = parse_networks('[{"name": "blue", "ipam-claim-reference": "vm1.blue"}]', "ns")
    assert selection.ipam_claim_reference == "vm1.blue"
    conf = {"plugins": [{"type": "macvlan", "args": {"cni": {"x": 1}}}, {"type": "tuning"}]}
    applied = apply_selection(conf, selection)
    assert [p["args"]["cni"] for p in applied["plugins"]] == [
        {"x": 1, "ipam-claim-reference": "vm1.blue"},
        {"ipam-claim-reference": "vm1.blue"},
    ]
    (empty,) = parse_networks('[{"name": "blue", "ipam-claim-reference": ""}]', "ns")
    assert empty.ipam_claim_reference is None


@pytest.mark.parametrize(
    ("element", "message"),
    [
        ('{"name": "blue", "ips": ["10.0.0.5/24"], "ipam-claim-reference": "vm1"}', "together"),
        ('{"name": "blue", "ipam-claim-reference": "VM_1"}', "not a valid IPAMClaim name"),
        ('{"name": "blue", "ipam-claim-reference": 7}', "ipam-claim-reference"),
    ],
)
def test_bad_claim_references(element: str, message: str) -> None:
    with pytest.raises(CNIError) as info:
        parse_networks(f"[{element}]", "ns")
    assert message in info.value.msg
