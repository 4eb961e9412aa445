"""Plexus's in-process whereabouts against a real kube-apiserver, and beside the real binary.

Each test keeps its pools in a namespace of its own. Plexus's IPAM is
delegates.ipam.whereabouts.plugin.ClusterIPAM (as the daemon makes it, with a watch of
the pools), called with the CNI arguments a runtime gives an IPAM; whereabouts is its
v0.9.4 binary (scripts/build-go-tools.sh) with a kubeconfig and flat file of the test's.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from ipaddress import ip_address, ip_interface
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from cni import callscope
from cni.env import cni_env
from cni.errors import CNIError, ErrorCode
from cni.skel import dispatch
from delegates.builtin import BuiltinExecutor
from delegates.ipam.common import CHECK_FAILED
from delegates.ipam.whereabouts.plugin import ClusterIPAM
from kube.api import KubeAPI
from meta.daemon.config import DaemonConfig
from meta.daemon.ipam import DaemonIPAM, _PoolUsage
from meta.records import AttachmentRecord, RecordStore
from meta.sources.kube import KubeSource
from tests.cluster.apiserver import ApiError, Cluster
from tests.cluster.whereabouts import (
    API,
    WhereaboutsBinary,
    allocations,
    binary_missing,
    install_crds,
    install_ipamclaims_crd,
    ipam_args,
    ipam_conf,
    pool,
    reservations,
)
from tests.netns.conftest import sh
from tests.wait import wait_for

Json = dict[str, Any]


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> Cluster:
    install_crds(cluster)
    return cluster


@pytest.fixture
def ipam(crds: Cluster, namespace: str) -> Iterator[ClusterIPAM]:
    """The daemon's IPAM for node `node-a`, its pools in the test's namespace."""
    plugin = ClusterIPAM(KubeAPI(str(crds.kubeconfig)), "node-a", namespace)
    plugin.start()
    assert plugin.store.informer is not None
    assert plugin.store.informer.synced.wait(30)
    yield plugin
    plugin.stop()


def add(plugin: ClusterIPAM, conf: Json, cid: str, **kw: Any) -> list[str]:
    """ADD through skel (as the daemon's executor calls it): the addresses given."""
    out = json.loads(dispatch(plugin, ipam_args("ADD", conf, cid, **kw)))
    return [ip["address"] for ip in out.get("ips", [])]


def held(cluster: Cluster, namespace: str, name: str, base: str) -> dict[str, str]:
    """The pool's addresses (from `base`, its network address) -> container ID."""
    net = ip_address(base)
    return {str(net + int(k)): v["id"] for k, v in allocations(cluster, namespace, name).items()}


# ---- config forms ---------------------------------------------------------------------


def test_a_cidr_range_fills_its_pool_from_the_lowest_address(
    ipam: ClusterIPAM, crds: Cluster, namespace: str
) -> None:
    conf = ipam_conf({"type": "whereabouts", "range": "10.10.0.0/29", "gateway": "10.10.0.1"})
    out = json.loads(dispatch(ipam, ipam_args("ADD", conf, "c1")))
    assert out == {
        "cniVersion": "1.0.0",
        "ips": [{"address": "10.10.0.1/29", "gateway": "10.10.0.1"}],
        "dns": {},
    }
    assert add(ipam, conf, "c2") == ["10.10.0.2/29"]
    found = pool(crds, namespace, "10.10.0.0-29")
    assert found is not None
    assert found["spec"] == {
        "range": "10.10.0.0/29",
        "allocations": {
            "1": {"id": "c1", "podref": "pods/pod-c1", "ifname": "net1"},
            "2": {"id": "c2", "podref": "pods/pod-c2", "ifname": "net1"},
        },
    }
    assert sorted(reservations(crds, namespace)) == ["10.10.0.1", "10.10.0.2"]


def test_dash_form_bounds_and_exclusions(ipam: ClusterIPAM, namespace: str) -> None:
    conf = ipam_conf(
        {
            "type": "whereabouts",
            "range": "10.11.0.4-10.11.0.9/24",
            "exclude": ["10.11.0.5", "10.11.0.6/31"],
        }
    )
    got = [add(ipam, conf, f"c{i}")[0] for i in range(3)]
    assert got == ["10.11.0.4/24", "10.11.0.8/24", "10.11.0.9/24"]
    with pytest.raises(CNIError) as info:
        add(ipam, conf, "c3")
    assert info.value.code == ErrorCode.TRY_AGAIN_LATER
    assert info.value.msg == (
        "Could not allocate IP in range: ip: 10.11.0.4 / - 10.11.0.9 / range: 10.11.0.0/24"
        " / excludeRanges: [10.11.0.5 10.11.0.6/31]"
    )


def test_range_start_end_keys_and_out_of_window_bounds_ignored(
    ipam: ClusterIPAM, namespace: str
) -> None:
    inside = ipam_conf(
        {"type": "whereabouts", "range": "10.12.0.0/24", "range_start": "10.12.0.200"}
    )
    assert add(ipam, inside, "c1") == ["10.12.0.200/24"]
    outside = ipam_conf(
        {"type": "whereabouts", "range": "10.13.0.0/24", "range_start": "10.99.0.1"},
        name="other",
    )
    assert add(ipam, outside, "c2") == ["10.13.0.1/24"]


def test_ipv6_and_dual_stack_with_network_name(
    ipam: ClusterIPAM, crds: Cluster, namespace: str
) -> None:
    conf = ipam_conf(
        {
            "type": "whereabouts",
            "network_name": "blue",
            "ipRanges": [{"range": "10.14.0.0/28"}, {"range": "fd00:14::/120"}],
        }
    )
    assert add(ipam, conf, "c1") == ["10.14.0.1/28", "fd00:14::1/120"]
    assert add(ipam, conf, "c2") == ["10.14.0.2/28", "fd00:14::2/120"]
    assert held(crds, namespace, "blue-fd00-14---120", "fd00:14::") == {
        "fd00:14::1": "c1",
        "fd00:14::2": "c2",
    }
    assert sorted(reservations(crds, namespace)) == [
        "blue-10.14.0.1",
        "blue-10.14.0.2",
        "blue-fd00-14--1",
        "blue-fd00-14--2",
    ]


def test_the_flat_file_fills_what_the_config_leaves_out(
    ipam: ClusterIPAM, namespace: str, tmp_path: Path
) -> None:
    flat = tmp_path / "etc/cni/net.d/whereabouts.d/whereabouts.conf"
    flat.parent.mkdir(parents=True)
    flat.write_text(
        json.dumps(
            {
                "range": "10.15.0.0/24",
                "range_start": "10.15.0.50",
                "gateway": "10.15.0.1",
                "enable_overlapping_ranges": False,
                "kubernetes": {"kubeconfig": "/nonexistent/ignored"},
            }
        )
    )
    conf = ipam_conf({"type": "whereabouts", "range_start": "10.15.0.7"})
    with callscope.call_scope() as scope:
        scope.root = str(tmp_path)
        out = json.loads(dispatch(ipam, ipam_args("ADD", conf, "c1")))
    # the config's own range_start wins, the flat file's range and gateway fill in
    assert out["ips"] == [{"address": "10.15.0.7/24", "gateway": "10.15.0.1"}]


def test_a_config_it_cannot_read_fails_naming_the_value(ipam: ClusterIPAM) -> None:
    for ipam_conf_, msg in (
        ({"type": "whereabouts", "range": "10.16.0.0/33"}, "invalid CIDR 10.16.0.0/33"),
        (
            {"type": "whereabouts", "range": "10.16.1.5-10.17.0.9/24"},
            "invalid range start for CIDR 10.17.0.0/24: 10.16.1.5",
        ),
        ({"type": "whereabouts", "range": "10.16.0.0/24", "gateway": "x"}, "gateway IP: x"),
        ({"type": "whereabouts", "network_name": "Blue", "range": "10.16.0.0/24"}, "'Blue-"),
    ):
        with pytest.raises(CNIError) as info:
            add(ipam, ipam_conf(ipam_conf_), "c1")
        assert info.value.code == ErrorCode.INVALID_CONFIG
        assert msg in f"{info.value.msg} {info.value.details}"


# ---- lifecycle --------------------------------------------------------------------------


def test_add_again_gives_the_same_address_a_new_sandbox_of_the_name_another(
    ipam: ClusterIPAM, crds: Cluster, namespace: str
) -> None:
    conf = ipam_conf({"type": "whereabouts", "range": "10.20.0.0/24"})
    assert add(ipam, conf, "c1", pod="web-0") == ["10.20.0.1/24"]
    assert add(ipam, conf, "c1", pod="web-0") == ["10.20.0.1/24"]
    # A StatefulSet's pod made again under its name, before its predecessor's DEL.
    assert add(ipam, conf, "c2", pod="web-0") == ["10.20.0.2/24"]
    assert held(crds, namespace, "10.20.0.0-24", "10.20.0.0") == {
        "10.20.0.1": "c1",
        "10.20.0.2": "c2",
    }


def test_del_releases_by_container_and_interface_and_check_follows(
    ipam: ClusterIPAM, crds: Cluster, namespace: str
) -> None:
    conf = ipam_conf({"type": "whereabouts", "range": "10.21.0.0/24"})
    add(ipam, conf, "c1", ifname="net1")
    add(ipam, conf, "c1", ifname="net2")
    prev = {**conf, "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.21.0.1/24"}]}}
    dispatch(ipam, ipam_args("CHECK", prev, "c1", ifname="net1"))
    with pytest.raises(CNIError) as info:  # net2 holds .2, not what this result says
        dispatch(ipam, ipam_args("CHECK", prev, "c1", ifname="net2"))
    assert info.value.code == CHECK_FAILED

    dispatch(ipam, ipam_args("DEL", conf, "c1", ifname="net1"))
    assert held(crds, namespace, "10.21.0.0-24", "10.21.0.0") == {"10.21.0.2": "c1"}
    assert sorted(reservations(crds, namespace)) == ["10.21.0.2"]
    with pytest.raises(CNIError) as info:
        dispatch(ipam, ipam_args("CHECK", conf, "c1", ifname="net1"))
    assert info.value.code == CHECK_FAILED
    dispatch(ipam, ipam_args("DEL", conf, "c1", ifname="net1"))  # again: nothing to do
    dispatch(ipam, ipam_args("DEL", conf, "unknown"))
    assert add(ipam, conf, "c3") == ["10.21.0.1/24"]  # the lowest free again


def test_gc_releases_this_nodes_attachments_not_listed(
    ipam: ClusterIPAM, crds: Cluster, namespace: str
) -> None:
    conf = ipam_conf({"type": "whereabouts", "range": "10.22.0.0/24"}, version="1.1.0")
    for cid in ("c1", "c2", "c3"):
        add(ipam, conf, cid)
    other = ClusterIPAM(KubeAPI(str(crds.kubeconfig)), "node-b", namespace, watch=False)
    add(other, conf, "b1")  # another node's: not this node's GC to release
    valid = {**conf, "cni.dev/valid-attachments": [{"containerID": "c2", "ifname": "net1"}]}
    dispatch(ipam, ipam_args("GC", valid, ""))
    assert held(crds, namespace, "10.22.0.0-24", "10.22.0.0") == {
        "10.22.0.2": "c2",
        "10.22.0.4": "b1",
    }
    assert sorted(reservations(crds, namespace)) == ["10.22.0.2", "10.22.0.4"]


def test_status_says_whether_pools_can_be_written(
    ipam: ClusterIPAM, crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    conf = ipam_conf({"type": "whereabouts", "range": "10.23.0.0/24"}, version="1.1.0")
    dispatch(ipam, ipam_args("STATUS", conf, ""))
    nobody = crds.client_certificate("nobody", "plexus-nobody")
    kubeconfig = tmp_path / "nobody.kubeconfig"
    kubeconfig.write_text(
        crds.kubeconfig.read_text()
        .replace(str(crds.pki.admin_crt), str(nobody))  # type: ignore[union-attr]
        .replace(str(crds.pki.admin_key), str(nobody))  # type: ignore[union-attr]
    )
    refused = ClusterIPAM(KubeAPI(str(kubeconfig)), "node-a", namespace, watch=False)
    with pytest.raises(CNIError) as info:
        dispatch(refused, ipam_args("STATUS", conf, ""))
    assert info.value.code == ErrorCode.NOT_AVAILABLE
    assert "403" in info.value.details
    # a hosted macvlan's STATUS asks its in-process IPAM (the daemon's executor)
    env = cni_env("STATUS", "", "", "", (), ["/usr/lib/cni"])
    BuiltinExecutor(cluster_ipam=ipam).run("macvlan", json.dumps(conf).encode(), env)
    with pytest.raises(CNIError) as info:
        BuiltinExecutor(cluster_ipam=refused).run("macvlan", json.dumps(conf).encode(), env)
    assert info.value.code == ErrorCode.NOT_AVAILABLE


# ---- many writers -----------------------------------------------------------------------


def test_overlapping_ranges_never_share_an_address_unless_disabled(
    ipam: ClusterIPAM, crds: Cluster, namespace: str
) -> None:
    wide = ipam_conf({"type": "whereabouts", "range": "10.24.0.0/24"}, name="wide")
    narrow = ipam_conf({"type": "whereabouts", "range": "10.24.0.0/28"}, name="narrow")
    assert add(ipam, wide, "c1") == ["10.24.0.1/24"]
    assert add(ipam, narrow, "c2") == ["10.24.0.2/28"]  # .1 is reserved by the other pool
    assert held(crds, namespace, "10.24.0.0-28", "10.24.0.0") == {"10.24.0.2": "c2"}
    apart = ipam_conf(
        {"type": "whereabouts", "range": "10.24.0.0/27", "enable_overlapping_ranges": False},
        name="apart",
    )
    assert add(ipam, apart, "c3") == ["10.24.0.1/27"]


def test_two_nodes_in_one_burst_get_distinct_addresses(
    ipam: ClusterIPAM, crds: Cluster, namespace: str
) -> None:
    other = ClusterIPAM(KubeAPI(str(crds.kubeconfig)), "node-b", namespace)
    other.start()
    try:
        conf = ipam_conf({"type": "whereabouts", "range": "10.25.0.0/26"})
        calls = [(ipam if i % 2 else other, f"c{i}") for i in range(40)]
        with ThreadPoolExecutor(8) as pool_:
            got = list(pool_.map(lambda c: add(c[0], conf, c[1])[0], calls))
    finally:
        other.stop()
    assert len(set(got)) == 40
    stored = held(crds, namespace, "10.25.0.0-26", "10.25.0.0")
    assert sorted(stored.values()) == sorted(cid for _, cid in calls)
    assert {str(ip_interface(a).ip) for a in got} == set(stored)


# ---- beside whereabouts itself ----------------------------------------------------------


@pytest.fixture
def whereabouts(crds: Cluster, namespace: str, tmp_path: Path) -> WhereaboutsBinary:
    missing = binary_missing()
    if missing:
        pytest.skip(missing)
    return WhereaboutsBinary(crds, namespace, tmp_path / "whereabouts")


def test_pool_and_reservation_match_what_whereabouts_writes(
    crds: Cluster, namespace: str, tmp_path: Path
) -> None:
    missing = binary_missing()
    if missing:
        pytest.skip(missing)
    theirs_ns, ours_ns = namespace, f"{namespace}-px"
    crds.create_namespace(ours_ns)
    binary = WhereaboutsBinary(crds, theirs_ns, tmp_path / "whereabouts")
    ours = ClusterIPAM(KubeAPI(str(crds.kubeconfig)), "node-a", ours_ns, watch=False)
    conf = ipam_conf(
        {
            "type": "whereabouts",
            "network_name": "lan",
            "ipRanges": [{"range": "10.26.0.0/24"}, {"range": "fd00:26::/112"}],
            "gateway": "10.26.0.254",
        }
    )
    for call in ("c1", "c2"):
        args = ipam_args("ADD", conf, call, pod=f"web-{call}", ifname="net1")
        theirs_out, ours_out = binary.run(args), json.loads(dispatch(ours, args))
        assert [ip["address"] for ip in theirs_out["ips"]] == [
            ip["address"] for ip in ours_out["ips"]
        ]
        # whereabouts gives the IPv4 gateway to the IPv6 address too; Plexus only to IPv4
        assert [ip.get("gateway") for ip in theirs_out["ips"]] == ["10.26.0.254"] * 2
        assert [ip.get("gateway") for ip in ours_out["ips"]] == ["10.26.0.254", None]
    for name in ("lan-10.26.0.0-24", "lan-fd00-26---112"):
        theirs, mine = pool(crds, theirs_ns, name), pool(crds, ours_ns, name)
        assert theirs is not None and mine is not None
        assert json.dumps(theirs["spec"], sort_keys=True) == json.dumps(
            mine["spec"], sort_keys=True
        )
        assert (theirs["apiVersion"], theirs["kind"]) == (mine["apiVersion"], mine["kind"])
    their_res, my_res = reservations(crds, theirs_ns), reservations(crds, ours_ns)
    assert sorted(their_res) == sorted(my_res)
    for name, theirs_obj in their_res.items():
        # Plexus adds the container ID whereabouts leaves out, and its node label
        assert {**theirs_obj["spec"], "containerid": my_res[name]["spec"]["containerid"]} == (
            my_res[name]["spec"]
        )


def test_side_by_side_with_whereabouts_on_one_pool(
    ipam: ClusterIPAM, whereabouts: WhereaboutsBinary, crds: Cluster, namespace: str
) -> None:
    conf = ipam_conf({"type": "whereabouts", "range": "10.27.0.0/26"})
    got: dict[str, str] = {}
    lock = threading.Lock()

    def theirs(i: int) -> None:
        out = whereabouts.run(ipam_args("ADD", conf, f"w{i}"))
        with lock:
            got[f"w{i}"] = out["ips"][0]["address"]

    def ours(i: int) -> None:
        (address,) = add(ipam, conf, f"p{i}")
        with lock:
            got[f"p{i}"] = address

    with ThreadPoolExecutor(6) as pool_:
        jobs = [pool_.submit(theirs if i % 3 == 0 else ours, i) for i in range(24)]
        for job in jobs:
            job.result()
    assert len(set(got.values())) == len(got) == 24
    stored = held(crds, namespace, "10.27.0.0-26", "10.27.0.0")
    assert {cid: f"{ip}/26" for ip, cid in stored.items()} == got

    # Each releases the other's: by container ID and interface.
    for cid in ("w0", "w3"):
        dispatch(ipam, ipam_args("DEL", conf, cid))
    for cid in ("p1", "p2"):
        whereabouts.run(ipam_args("DEL", conf, cid))
    left = held(crds, namespace, "10.27.0.0-26", "10.27.0.0")
    assert sorted(left.values()) == sorted(set(got) - {"w0", "w3", "p1", "p2"})
    assert sorted(reservations(crds, namespace)) == sorted(left)


# ---- the daemon's reconcile ----------------------------------------------------------


@pytest.fixture
def daemon_ipam(crds: Cluster, namespace: str) -> Iterator[Callable[[str, Path], DaemonIPAM]]:
    """Makes the IPAM of a daemon of node `node` (cniDir `cni_dir`); stopped at the end."""
    made: list[DaemonIPAM] = []

    def make(node: str, cni_dir: Path) -> DaemonIPAM:
        conf = DaemonConfig.model_validate(
            {
                "cniVersion": "1.0.0",
                "name": "plexus",
                "type": "plexus",
                "clusterNetwork": "default",
                "cniDir": str(cni_dir),
                "whereaboutsNamespace": namespace,
                "ipamReconcileSeconds": 5,
            }
        )
        made.append(DaemonIPAM(conf, KubeSource(KubeAPI(str(crds.kubeconfig)), node), node))
        return made[-1]

    yield make
    for daemon in made:
        daemon.stop()


def record(store: RecordStore, cid: str, namespace: str, pod: str, uid: str) -> None:
    store.save(
        AttachmentRecord(
            container_id=cid,
            netns=f"/var/run/netns/pxt-gone-{cid}",
            ifname="eth0",
            pod_namespace=namespace,
            pod_name=pod,
            pod_uid=uid,
            delegates=[],
        )
    )


@pytest.fixture
def nodes(crds: Cluster, namespace: str) -> Iterator[tuple[str, str]]:
    """Two Node objects (no kubelet behind them), named after the test's namespace."""
    names = (f"a-{namespace}", f"b-{namespace}")
    for name in names:
        crds.create("/api/v1/nodes", {"metadata": {"name": name}})
    yield names
    for name in names:
        crds.request("DELETE", f"/api/v1/nodes/{name}")


def test_reconcile_releases_this_nodes_dead_containers_only(
    crds: Cluster,
    namespace: str,
    tmp_path: Path,
    nodes: tuple[str, str],
    daemon_ipam: Callable[[str, Path], DaemonIPAM],
) -> None:
    daemon = daemon_ipam(nodes[0], tmp_path)
    conf = ipam_conf({"type": "whereabouts", "range": "10.28.0.0/24"})
    pod = crds.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": "alive"},
            "spec": {"containers": [{"name": "c", "image": "pause"}]},
        },
    )
    records = RecordStore(tmp_path)
    # alive: recorded, its pod (same UID) on the API server; deleted: recorded, its pod
    # gone and its netns too; forgotten: no record (its DEL removed it, the release failed)
    record(records, "alive", namespace, "alive", pod["metadata"]["uid"])
    record(records, "replaced", namespace, "alive", "an-older-uid")
    record(records, "deleted", namespace, "deleted", "uid-d")
    for cid in ("alive", "replaced", "deleted", "forgotten"):
        add(daemon.ipam, conf, cid, namespace=namespace, pod=cid)
    other = ClusterIPAM(KubeAPI(str(crds.kubeconfig)), nodes[1], namespace, watch=False)
    add(other, conf, "elsewhere")  # another node's: not this node's to judge

    daemon.reconcile()
    assert sorted(held(crds, namespace, "10.28.0.0-24", "10.28.0.0").values()) == [
        "alive",
        "elsewhere",
    ]
    assert len(reservations(crds, namespace)) == 2
    registry = CollectorRegistry()
    registry.register(_PoolUsage(daemon))
    text = generate_latest(registry).decode()
    assert 'plexus_ipam_addresses{pool="10.28.0.0-24",state="used"} 2.0' in text
    assert 'plexus_ipam_addresses{pool="10.28.0.0-24",state="free"} 252.0' in text


def test_the_lease_holder_releases_the_addresses_of_deleted_nodes(
    crds: Cluster,
    namespace: str,
    tmp_path: Path,
    nodes: tuple[str, str],
    daemon_ipam: Callable[[str, Path], DaemonIPAM],
) -> None:
    conf = ipam_conf({"type": "whereabouts", "range": "10.29.0.0/24"})
    mine = daemon_ipam(nodes[0], tmp_path / "a")
    record(RecordStore(tmp_path / "a"), "here", namespace, "p", "")  # no UID: never judged
    add(mine.ipam, conf, "here")
    doomed = f"doomed-{namespace}"
    crds.create("/api/v1/nodes", {"metadata": {"name": doomed}})
    there = ClusterIPAM(KubeAPI(str(crds.kubeconfig)), doomed, namespace, watch=False)
    add(there, conf, "there1")
    add(there, conf, "there2")
    rival = daemon_ipam(nodes[1], tmp_path / "b")

    mine.reconcile()  # takes the Lease; every node is there: nothing released
    assert not rival.lease.try_hold()
    assert len(held(crds, namespace, "10.29.0.0-24", "10.29.0.0")) == 3
    crds.request("DELETE", f"/api/v1/nodes/{doomed}")
    assert not rival.lease.try_hold()
    mine.reconcile()  # renews it and releases the deleted node's
    assert list(held(crds, namespace, "10.29.0.0-24", "10.29.0.0").values()) == ["here"]
    assert list(reservations(crds, namespace)) == ["10.29.0.1"]


# ---- IPAMClaims ---------------------------------------------------------------------------


def test_an_ipamclaim_keeps_its_address_across_pods_until_it_is_deleted(
    crds: Cluster,
    namespace: str,
    tmp_path: Path,
    nodes: tuple[str, str],
    daemon_ipam: Callable[[str, Path], DaemonIPAM],
) -> None:
    install_ipamclaims_crd(crds)
    claims = f"/apis/k8s.cni.cncf.io/v1alpha1/namespaces/{namespace}/ipamclaims"
    crds.create(
        claims,
        {
            "apiVersion": "k8s.cni.cncf.io/v1alpha1",
            "kind": "IPAMClaim",
            "metadata": {"name": "vm1.blue"},
            "spec": {"network": "blue", "interface": "net1"},
        },
    )
    daemon = daemon_ipam(nodes[0], tmp_path)
    record(RecordStore(tmp_path), "c2", namespace, "other", "")  # alive all along
    ipam = daemon.ipam
    plain = ipam_conf({"type": "whereabouts", "range": "10.30.0.0/24"})
    claimed = {**plain, "args": {"cni": {"ipam-claim-reference": "vm1.blue"}}}

    def call(verb: str, conf: Json, cid: str, pod: str) -> list[str]:
        out = dispatch(ipam, ipam_args(verb, conf, cid, pod=pod, namespace=namespace))
        return [ip["address"] for ip in json.loads(out).get("ips", [])] if out else []

    assert call("ADD", claimed, "c1", "virt-a") == ["10.30.0.1/24"]
    claim = crds.get(f"{claims}/vm1.blue")
    assert claim["status"]["ips"] == ["10.30.0.1/24"]
    assert claim["status"]["ownerPod"] == {"name": "virt-a"}
    assert "ipam.plexus.io/release" in claim["metadata"]["finalizers"]
    assert call("ADD", plain, "c2", "other") == ["10.30.0.2/24"]

    call("DEL", claimed, "c1", "virt-a")  # the pod goes; its claim keeps the address
    assert held(crds, namespace, "10.30.0.0-24", "10.30.0.0") == {
        "10.30.0.1": "c1",
        "10.30.0.2": "c2",
    }
    assert call("ADD", claimed, "c3", "virt-b") == ["10.30.0.1/24"]  # the VM, elsewhere
    assert held(crds, namespace, "10.30.0.0-24", "10.30.0.0")["10.30.0.1"] == "c3"
    call("DEL", claimed, "c3", "virt-b")
    daemon.reconcile()  # no record of c3 any more: still the claim's
    assert "10.30.0.1" in held(crds, namespace, "10.30.0.0-24", "10.30.0.0")

    crds.request("DELETE", f"{claims}/vm1.blue")
    assert crds.get(f"{claims}/vm1.blue")["metadata"]["deletionTimestamp"]
    daemon.reconcile()  # the Lease holder releases a deleted claim's addresses
    assert held(crds, namespace, "10.30.0.0-24", "10.30.0.0") == {"10.30.0.2": "c2"}
    assert sorted(reservations(crds, namespace)) == ["10.30.0.2"]
    with pytest.raises(ApiError) as gone:
        crds.get(f"{claims}/vm1.blue")
    assert gone.value.status == 404

    with pytest.raises(CNIError) as info:
        call("ADD", claimed, "c4", "virt-c")
    assert info.value.code == ErrorCode.TRY_AGAIN_LATER
    assert "IPAMClaim" in info.value.msg and "does not exist" in info.value.msg


# ---- node slices ------------------------------------------------------------------------


def test_node_slices_give_each_node_a_pool_of_its_own(
    crds: Cluster, namespace: str, whereabouts: WhereaboutsBinary
) -> None:
    conf = ipam_conf(
        {
            "type": "whereabouts",
            "range": "10.40.0.0/22",
            "node_slice_size": "/24",
            "network_name": "big",
            "exclude": ["10.40.0.1", "10.40.1.1", "10.40.2.1", "10.40.3.1"],  # dropped
        }
    )
    api = KubeAPI(str(crds.kubeconfig))
    ipams = {n: ClusterIPAM(api, n, namespace, watch=False) for n in ("node-a", "node-b")}
    got = {n: add(ipam, conf, f"{n}-1") for n, ipam in ipams.items()}
    slices = crds.get(f"{API}/namespaces/{namespace}/nodeslicepools/big")
    assert slices["spec"] == {"range": "10.40.0.0/22", "sliceSize": "/24"}
    owners = {a["sliceRange"]: a["nodeName"] for a in slices["status"]["allocations"]}
    assert sorted(owners) == [f"10.40.{i}.0/24" for i in range(4)]
    mine = {node: cidr for cidr, node in owners.items() if node}
    assert sorted(mine) == ["node-a", "node-b"] and mine["node-a"] != mine["node-b"]
    for node, cidr in mine.items():
        first = ip_interface(cidr).network.network_address + 1
        # the slice's first usable address, with the whole range's prefix length
        assert got[node] == [f"{first}/22"]
        pool_name = f"big-{node}-{cidr.replace('/', '-')}"
        assert held(crds, namespace, pool_name, cidr.split("/")[0]) == {str(first): f"{node}-1"}
    # whereabouts on node-a finds node-a's slice and shares its pool
    out = whereabouts.run(ipam_args("ADD", conf, "w1"), node="node-a")
    second = ip_interface(mine["node-a"]).network.network_address + 2
    assert [ip["address"] for ip in out["ips"]] == [f"{second}/22"]
    # a deleted node's slice goes to the next node that asks
    node_a = ipams["node-a"]
    assert node_a.allocator.slices is not None
    assert node_a.allocator.slices.free("node-b") == 1
    taken = ClusterIPAM(api, "node-c", namespace, watch=False)
    add(taken, conf, "c1")
    slices = crds.get(f"{API}/namespaces/{namespace}/nodeslicepools/big")
    assert sorted(a["nodeName"] for a in slices["status"]["allocations"]) == [
        "",
        "",
        "node-a",
        "node-c",
    ]


def test_a_hosted_macvlan_allocates_beside_its_link_and_a_failed_link_releases(
    ipam: ClusterIPAM, crds: Cluster, namespace: str
) -> None:
    pod = f"pxt-wb-{uuid.uuid4().hex[:6]}"
    sh("ip", "netns", "add", pod)
    try:
        sh("ip", "link", "add", "m0", "type", "veth", "peer", "name", "m1", netns=pod)
        sh("ip", "link", "set", "m0", "up", netns=pod)
        conf = {
            "cniVersion": "1.0.0",
            "name": "lan",
            "type": "macvlan",
            "master": "m0",
            "linkInContainer": True,
            "ipam": {"type": "whereabouts", "range": "10.31.0.0/24"},
        }
        executor = BuiltinExecutor(cluster_ipam=ipam)
        pairs = (("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "ns"), ("K8S_POD_NAME", "p"))

        def run(verb: str, cid: str, config: Json) -> bytes:
            env = cni_env(verb, cid, f"/run/netns/{pod}", "net1", pairs, ["/usr/lib/cni"])
            return executor.run("macvlan", json.dumps(config).encode(), env)

        out = json.loads(run("ADD", "c1", conf))
        assert out["ips"][0]["address"] == "10.31.0.1/24"
        assert "10.31.0.1/24" in sh("ip", "-o", "addr", "show", "net1", netns=pod).stdout
        with pytest.raises(CNIError):  # no such master: the allocation made beside goes
            run("ADD", "c2", {**conf, "master": "nope"})
        assert held(crds, namespace, "10.31.0.0-24", "10.31.0.0") == {"10.31.0.1": "c1"}
        run("DEL", "c1", conf)
        assert held(crds, namespace, "10.31.0.0-24", "10.31.0.0") == {}
    finally:
        sh("ip", "netns", "del", pod, check=False)


# ---- addresses reserved ahead ---------------------------------------------------------------


def test_addresses_reserved_ahead_are_taken_without_a_write_and_rewritten_after(
    crds: Cluster, namespace: str, tmp_path: Path, nodes: tuple[str, str]
) -> None:
    api = KubeAPI(str(crds.kubeconfig))
    journal = tmp_path / "journal"
    ipam = ClusterIPAM(api, nodes[0], namespace, watch=False, reserve=2, journal=journal)
    conf = ipam_conf({"type": "whereabouts", "range": "10.32.0.0/24"}, version="1.1.0")
    mark = f"{namespace}/plexus-reserved-{nodes[0]}"

    def pool_now() -> dict[str, str]:
        return {
            f"10.32.0.{k}": f"{v['id']}|{v['podref']}"
            for k, v in allocations(crds, namespace, "10.32.0.0-24").items()
        }

    def reserved() -> list[str]:
        return sorted(ip for ip, who in pool_now().items() if who.endswith(f"|{mark}"))

    assert add(ipam, conf, "c1") == ["10.32.0.1/24"]  # nothing reserved yet: written now
    wait_for(lambda: reserved() == ["10.32.0.2", "10.32.0.3"], "two addresses reserved ahead")
    assert add(ipam, conf, "c2") == ["10.32.0.2/24"]  # taken from the stock
    wait_for(lambda: pool_now().get("10.32.0.2") == "c2|pods/pod-c2", "c2's entry rewritten")
    wait_for(lambda: reserved() == ["10.32.0.3", "10.32.0.4"], "the stock refilled")
    reservation = reservations(crds, namespace)["10.32.0.2"]
    assert reservation["spec"] == {"containerid": "c2", "podref": "pods/pod-c2", "ifname": "net1"}
    assert "ipam.plexus.io/stock" not in reservation["metadata"]["labels"]
    assert not list(journal.glob("*"))  # every rewrite done

    valid = {**conf, "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "net1"}]}
    dispatch(ipam, ipam_args("GC", valid, ""))  # c2 goes; the stock stays
    assert sorted(pool_now()) == ["10.32.0.1", "10.32.0.3", "10.32.0.4"]
    dispatch(ipam, ipam_args("DEL", conf, "c1"))

    # A restarted daemon gives its predecessor's stock back.
    again = ClusterIPAM(api, nodes[0], namespace, watch=False, reserve=2, journal=journal)
    assert pool_now() == {}
    assert reservations(crds, namespace) == {}
    assert add(again, conf, "c3") == ["10.32.0.1/24"]


def test_a_reservation_someone_else_released_is_not_handed_out(
    crds: Cluster, namespace: str, tmp_path: Path, nodes: tuple[str, str]
) -> None:
    api = KubeAPI(str(crds.kubeconfig))
    ipam = ClusterIPAM(api, nodes[0], namespace, reserve=2, journal=tmp_path / "journal")
    ipam.start()
    try:
        conf = ipam_conf({"type": "whereabouts", "range": "10.33.0.0/24"}, version="1.1.0")
        assert add(ipam, conf, "c1") == ["10.33.0.1/24"]
        wait_for(
            lambda: sorted(allocations(crds, namespace, "10.33.0.0-24")) == ["1", "2", "3"],
            "two addresses reserved ahead",
        )
        # As whereabouts' reconciler frees an allocation whose podref names no pod.
        crds.request(
            "PATCH",
            f"{API}/namespaces/{namespace}/ippools/10.33.0.0-24",
            [{"op": "remove", "path": "/spec/allocations/2"}],
            content_type="application/json-patch+json",
        )

        def released() -> bool:
            pool = ipam.store.get("10.33.0.0-24", "", create=False)
            return pool is not None and "2" not in pool.allocations

        wait_for(released, "the daemon's copy of the pool shows .2 released")
        assert add(ipam, conf, "c2") == ["10.33.0.3/24"]  # not .2: it is no longer reserved
    finally:
        ipam.stop()
