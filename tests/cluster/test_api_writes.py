"""The daemon's API writes against a real kube-apiserver: never in the way of an ADD.

Events go to a background queue; the network-status write is bounded (apiWriteTimeout)
and continues in that queue when the server does not answer. A black-holed server
(packets dropped, not refused) is made with an iptables DROP rule in the node namespace,
so connects and reads on kept-alive connections both hang, as on a real network.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from tests.cluster.apiserver import ApiError
from tests.cluster.test_daemon_kube import API_WAIT, STATUS, KubeNode
from tests.cluster.test_daemon_kube import kube as kube  # the fixture
from tests.cluster.webhook import EventHold
from tests.netns.conftest import sh
from tests.netns.daemon import Daemon
from tests.wait import wait_for

# Generous: the bound is 2 s; before it, a black-holed server held an ADD 10 s per write.
WELL_UNDER_THE_OLD_WAIT = 8.0


def _restart(kube: KubeNode, **conf: Any) -> None:
    kube.daemon.stop()
    kube.daemon = Daemon(kube.node, **kube.settings(**conf))
    kube.daemon.start()


@contextlib.contextmanager
def _black_hole(kube: KubeNode) -> Iterator[None]:
    """Drop every packet to the API server's address in the node (nothing is refused)."""
    rule = ("INPUT", "-i", "lo", "-p", "tcp", "--dport", str(kube.forward.port), "-j", "DROP")
    sh("iptables", "-I", *rule, netns=kube.node.name)
    try:
        yield
    finally:
        sh("iptables", "-D", *rule, netns=kube.node.name, check=False)


def _want(kube: KubeNode) -> list[tuple[str, str]]:
    """The network-status (network, interface) of the pods here."""
    return [("default-net", "eth0"), (f"{kube.namespace}/macvlan-net", "net1")]


def _status(kube: KubeNode, pod: str) -> list[tuple[str, str]]:
    notes = kube.get_pod(pod)["metadata"].get("annotations", {})
    return [(e["name"], e["interface"]) for e in json.loads(notes.get(STATUS, "[]"))]


def _added(kube: KubeNode, pod: str) -> list[str]:
    items = kube.cluster.get(f"/api/v1/namespaces/{kube.namespace}/events")["items"]
    return sorted(
        e["message"]
        for e in items
        if e["reason"] == "AddedInterface" and e["involvedObject"]["name"] == pod
    )


def _eventually_written(kube: KubeNode, pod: str) -> None:
    """Wait for the pod's network-status and both its AddedInterface events."""
    wait_for(lambda: _status(kube, pod) == _want(kube), f"{pod}'s network-status", API_WAIT)
    wait_for(lambda: len(_added(kube, pod)) == 2, f"{pod}'s events", API_WAIT)


def _timed_add(kube: KubeNode, pod: str, uid: str) -> tuple[str, float]:
    started = time.monotonic()
    netns, done = kube.add(pod, uid)
    assert done.returncode == 0, done.stdout + done.stderr
    return netns, time.monotonic() - started


def test_black_holed_api_server_does_not_hold_the_add(kube: KubeNode) -> None:
    kube.nad("macvlan-net", kube.node.macvlan_conf())
    uids = {pod: kube.pod(pod, "macvlan-net") for pod in ("bh1", "bh2")}

    with _black_hole(kube):
        # Two ADDs: the first leaves a stuck connection behind, which must not hold the next.
        for pod, uid in uids.items():
            netns, took = _timed_add(kube, pod, uid)
            assert took < WELL_UNDER_THE_OLD_WAIT, f"ADD of {pod} took {took:.1f} s"
            assert kube.node.links(netns) == ["eth0", "lo", "net1"]
        assert _status(kube, "bh1") == []  # not written yet: the server never saw it

    for pod in uids:
        _eventually_written(kube, pod)
        assert [m.split(" ")[1] for m in _added(kube, pod)] == ["eth0", "net1"]
    wait_for(
        lambda: kube.daemon.metric("plexus_api_writes_queued") == 0, "an empty queue", API_WAIT
    )


def test_add_answers_before_its_events_are_written(kube: KubeNode) -> None:
    kube.nad("macvlan-net", kube.node.macvlan_conf())
    uid = kube.pod("ev", "macvlan-net")

    with EventHold(kube.cluster, kube.namespace) as hold:
        _, done = kube.add("ev", uid)
        passed_when_answered = list(hold.passed)
        hold.release()
        assert done.returncode == 0, done.stdout + done.stderr
        assert passed_when_answered == []  # the ADD did not wait for any event

    assert _status(kube, "ev") == _want(kube)  # the status write is still part of the ADD
    wait_for(lambda: len(_added(kube, "ev")) == 2, "events", API_WAIT)
    eth0, net1 = _added(kube, "ev")
    assert eth0.startswith("Add eth0 [10.99.") and eth0.endswith("] from default-net")
    assert net1.startswith("Add net1 [10.98.") and net1.endswith(
        f"] from {kube.namespace}/macvlan-net"
    )


def test_full_write_queue_drops_events_first_and_counts_them(kube: KubeNode) -> None:
    _restart(kube, apiWriteBacklog=2)
    kube.nad("macvlan-net", kube.node.macvlan_conf())
    uid = kube.pod("full", "macvlan-net")
    dropped = "plexus_api_writes_dropped_total"

    with _black_hole(kube):
        _timed_add(kube, "full", uid)  # queues its status and one event; the other is dropped
        assert kube.daemon.metric("plexus_api_writes_queued") == 2
        assert kube.daemon.metric(dropped, kind="event", reason="full") == 1
        assert kube.daemon.metric(dropped, kind="status", reason="full") == 0

    wait_for(lambda: _status(kube, "full") == _want(kube), "network-status", API_WAIT)
    wait_for(lambda: len(_added(kube, "full")) == 1, "the queued event", API_WAIT)
    assert _added(kube, "full")[0].startswith("Add eth0 ")


def test_queued_status_never_lands_on_a_newer_pod_of_the_same_name(kube: KubeNode) -> None:
    kube.nad("macvlan-net", kube.node.macvlan_conf())
    uid = kube.pod("again", "macvlan-net")
    dropped = "plexus_api_writes_dropped_total"

    with _black_hole(kube):
        _timed_add(kube, "again", uid)  # its status waits in the queue, for this UID
        path = f"/api/v1/namespaces/{kube.namespace}/pods/again"
        kube.cluster.request("DELETE", path, query={"gracePeriodSeconds": "0"})  # no kubelet
        wait_for(lambda: _gone(kube, "again"), "the pod's deletion", API_WAIT)
        newer = kube.create_pod("again", "macvlan-net")  # the daemon is cut off
    assert newer != uid

    wait_for(
        lambda: kube.daemon.metric(dropped, kind="status", reason="rejected") == 1, "drop", API_WAIT
    )
    assert _status(kube, "again") == []


def _gone(kube: KubeNode, pod: str) -> bool:
    try:
        kube.get_pod(pod)
    except ApiError as err:
        return err.status == 404
    return False
