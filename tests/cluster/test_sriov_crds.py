"""crds/sriovnetwork-crds.yaml on the real kube-apiserver: the operator's YAML is accepted with
its defaults, and its webhook's static checks refuse what the operator refuses, as CEL rules
(no webhook runs). What Plexus does not implement is refused with a message saying so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import sriov
from tests.cluster.apiserver import ApiError, Cluster

BASE: dict[str, Any] = {
    "resourceName": "intelnics",
    "nodeSelector": {"feature.node.kubernetes.io/network-sriov.capable": "true"},
    "numVfs": 4,
    "nicSelector": {"pfNames": ["ens1f0#0-1"]},
}


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> Iterator[Cluster]:
    sriov.install(cluster)
    yield cluster


def refusal(cluster: Cluster, obj: dict[str, Any]) -> str:
    """The API server's message for `obj` (a dry run), "" if it accepts it."""
    try:
        cluster.apply(obj, dry_run=True)
    except ApiError as err:
        assert err.status == 422, err.body
        return str(json.loads(err.body)["message"])
    return ""


def test_a_policy_as_users_write_it_is_stored_with_the_operators_defaults(crds: Cluster) -> None:
    stored = crds.apply(sriov.policy("intel-nics", **BASE), dry_run=True)
    assert stored["spec"]["deviceType"] == "netdevice"
    assert "priority" not in stored["spec"]  # unset: 0, the highest, as in the operator
    net = crds.apply(sriov.network("net1", resourceName="intelnics"), dry_run=True)
    assert net["spec"]["logLevel"] == "info"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"nicSelector": {}},
            "at least one of these parameters (vendor, deviceID, pfNames, rootDevices or "
            "netFilter) has to be defined in nicSelector",
        ),
        (
            {"nicSelector": {"pfNames": ["ens1f0#2-1"]}},
            "a pfNames partition '<pf>#<first>-<last>' needs first <= last < numVfs",
        ),
        (
            {"nicSelector": {"pfNames": ["ens1f0#0-4"]}},  # numVfs is 4: the last VF is 3
            "a pfNames partition '<pf>#<first>-<last>' needs first <= last < numVfs",
        ),
        (
            {"nicSelector": {"pfNames": ["ens1f0#3"]}},
            "a pfNames partition must read '<pf>#<first>-<last>' (one '#', one '-')",
        ),
        (
            {"deviceType": "vfio-pci", "isRdma": True},
            "'deviceType: vfio-pci' conflicts with 'isRdma: true'",
        ),
        ({"resourceName": "-nics"}, "spec.resourceName in body should match"),
        ({"priority": 100}, "spec.priority: Invalid value: 100"),
        ({"eSwitchMode": "switchdev"}, "eSwitchMode switchdev is not supported by Plexus"),
        ({"vdpaType": "virtio"}, "vdpaType needs eSwitchMode switchdev"),
        ({"bridge": {"ovs": {}}}, "bridge (OVS software bridge management) is not supported"),
        (
            {"nicSelector": {"netFilter": "openstack/NetworkID:8a6b"}},
            "netFilter (OpenStack/AWS network selection) is not supported by Plexus",
        ),
    ],
)
def test_the_webhooks_static_checks_are_crd_rules(
    crds: Cluster, change: dict[str, Any], message: str
) -> None:
    assert message in refusal(crds, sriov.policy("p", **{**BASE, **change}))


@pytest.mark.parametrize(
    ("value", "ok"), [(1, True), (0, True), ("10%", True), ("0%", False), ("x", False), (-1, False)]
)
def test_max_unavailable_is_a_count_or_a_percentage(
    crds: Cluster, value: int | str, ok: bool
) -> None:
    why = refusal(crds, sriov.pool_config("pool", value, {"pool": "a"}))
    assert (why == "") == ok, why


def test_what_needs_a_kernel_argument_is_refused(crds: Cluster) -> None:
    pool = sriov.pool_config("pool", 1, {"pool": "a"})
    pool["spec"]["rdmaMode"] = "exclusive"
    assert "rdmaMode is not supported by Plexus" in refusal(crds, pool)


def test_an_infiniband_network_is_refused_loudly(crds: Cluster) -> None:
    ib = sriov.network("ib", resourceName="mlxnics")
    ib["kind"] = "SriovIBNetwork"
    assert "SriovIBNetwork (InfiniBand, ib-sriov CNI) is not supported by Plexus" in refusal(
        crds, ib
    )
