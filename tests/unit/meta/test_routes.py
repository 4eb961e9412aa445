"""default-route planning and its effect on results."""

from __future__ import annotations

import pytest

from cni.errors import CNIError
from cni.result import Result
from meta.delegate import Delegate
from meta.routes import apply_to_result, plan_default_routes


def _d(ifname: str, *gws: str) -> Delegate:
    return Delegate(network=ifname, ifname=ifname, config={"type": "x"}, gateway_request=list(gws))


def test_no_request_changes_nothing() -> None:
    assert plan_default_routes([_d("eth0"), _d("net1")]).empty


def test_request_strips_other_interfaces_of_that_family_only() -> None:
    plan = plan_default_routes([_d("eth0"), _d("net1", "10.1.0.1"), _d("net2", "fd00::1")])
    assert plan.strip == {"eth0": {4, 6}, "net1": {6}, "net2": {4}}
    assert plan.gateways == {"net1": ["10.1.0.1"], "net2": ["fd00::1"]}


def test_two_gateways_of_one_family_are_refused() -> None:
    with pytest.raises(CNIError, match="more than one IPv4 gateway"):
        plan_default_routes([_d("net1", "10.1.0.1"), _d("net2", "10.2.0.1")])


def test_result_routes_follow_the_plan() -> None:
    result = Result.from_dict(
        {
            "cniVersion": "1.0.0",
            "ips": [{"address": "10.0.0.5/24", "gateway": "10.0.0.1"}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}, {"dst": "10.9.0.0/16"}],
        }
    )
    plan = plan_default_routes([_d("eth0"), _d("net1", "10.1.0.1")])
    stripped = apply_to_result(result, "eth0", plan)
    assert [str(r.dst) for r in stripped.routes] == ["10.9.0.0/16"]
    added = apply_to_result(result, "net1", plan)
    assert [(str(r.dst), str(r.gw)) for r in added.routes] == [
        ("10.9.0.0/16", "None"),
        ("0.0.0.0/0", "10.1.0.1"),
    ]
