"""The prefetched claims of the node's pods (deviceplugin/dra/claims.py).

The cache's informer and reads run against a FAKE API (a list of pods, a watch that
stays quiet, one GET per claim): the real kube-apiserver's part is in the cluster tier
(tests/cluster/test_dra.py counts the plugin's requests there).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from deviceplugin.dra import claims
from deviceplugin.dra.claims import ClaimCache, pod_claims
from deviceplugin.dra.slices import DRIVER
from kube.api import APIError, KubeAPI

Json = dict[str, Any]
CLAIM_UID = "c-1"
POD_UID = "p-1"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/"


class FakeAPI:
    """FAKE KubeAPI: the pods of a list, no watch events, claims by name, GETs counted."""

    def __init__(self, pods: list[Json], by_name: dict[str, Json]) -> None:
        self.pods = pods
        self.by_name = by_name
        self.gets: list[str] = []
        self.closed = threading.Event()

    def request(self, method: str, path: str) -> Json:
        if path.startswith("/api/v1/pods?"):
            return {"items": self.pods, "metadata": {"resourceVersion": "1"}}
        self.gets.append(path)
        name = path.removeprefix(CLAIMS)
        if name not in self.by_name:
            raise APIError(404, "not found")
        return self.by_name[name]

    def watch(self, path: str, timeout_seconds: int) -> Iterator[Json]:
        self.closed.wait()
        yield from ()


def pod(name: str = "p", uid: str = POD_UID, phase: str = "Running", **claim_refs: str) -> Json:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "spec": {
            "resourceClaims": [{"name": k, "resourceClaimName": v} for k, v in claim_refs.items()]
        },
        "status": {"phase": phase},
    }


def claim(uid: str = CLAIM_UID, reserved_for: str = POD_UID, driver: str = DRIVER) -> Json:
    result = {"request": "vf", "driver": driver, "pool": "p", "device": "d"}
    return {
        "metadata": {"uid": uid},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": reserved_for}],
        },
    }


@pytest.fixture(autouse=True)
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claims, "WAIT_SECONDS", 120.0)  # never the reason a test passes


def running(api: FakeAPI) -> ClaimCache:
    cache = ClaimCache(cast(KubeAPI, api), "node-a")
    cache.start()
    assert cache.pods.synced.wait(60)
    return cache


def stop(cache: ClaimCache, api: FakeAPI) -> None:
    cache.stop()
    api.closed.set()


def test_pod_claims_names_direct_and_generated_claims() -> None:
    obj = pod(vf="mine")
    obj["spec"]["resourceClaims"].append({"name": "t", "resourceClaimTemplateName": "tmpl"})
    obj["spec"]["resourceClaims"].append({"name": "none", "resourceClaimTemplateName": "tmpl"})
    obj["status"]["resourceClaimStatuses"] = [
        {"name": "t", "resourceClaimName": "p-t-x1"},
        {"name": "none"},  # the template asked for no claim
    ]
    assert pod_claims(obj).claims == ("mine", "p-t-x1")
    assert pod_claims(pod(phase="Succeeded")).terminal


def test_a_claim_reserved_for_the_pod_is_read_once_and_taken_once() -> None:
    api = FakeAPI([pod(vf="mine")], {"mine": claim()})
    cache = running(api)
    try:
        assert cache.take("ns", "mine", CLAIM_UID) == claim()
        assert cache.take("ns", "mine", CLAIM_UID) is None  # the state answers repeats
        assert api.gets == [CLAIMS + "mine"]  # consistent: no resourceVersion=0
    finally:
        stop(cache, api)


@pytest.mark.parametrize(
    ("stored", "uid"),
    [
        (claim(reserved_for="someone-else"), CLAIM_UID),  # not (yet) reserved for the pod
        (claim(driver="gpu.example.com"), CLAIM_UID),  # nothing of ours to prepare
        (claim(), "another-uid"),  # the claim was replaced under the same name
    ],
)
def test_a_copy_prepare_could_not_trust_is_a_miss(stored: Json, uid: str) -> None:
    api = FakeAPI([pod(vf="mine")], {"mine": stored})
    cache = running(api)
    try:
        assert cache.take("ns", "mine", uid) is None
    finally:
        stop(cache, api)


def test_no_copy_once_its_pod_is_gone_or_done() -> None:
    api = FakeAPI([pod(vf="mine"), pod("q", "p-2", vf="theirs")], {"mine": claim()})
    api.by_name["theirs"] = claim(reserved_for="p-2")
    cache = running(api)
    try:
        # The informer's view after a DELETED event of one pod and a phase change of the other.
        cache.pods.items.pop(("ns", "p"))
        cache.pods.items[("ns", "q")] = pod_claims(pod("q", "p-2", "Failed", vf="theirs"))
        assert cache.take("ns", "mine", CLAIM_UID) is None
        assert cache.take("ns", "theirs", CLAIM_UID) is None
    finally:
        stop(cache, api)


def test_a_claim_of_no_pod_seen_is_a_miss_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claims, "WAIT_SECONDS", 0.01)
    api = FakeAPI([], {"mine": claim()})
    cache = running(api)
    try:
        assert cache.take("ns", "mine", CLAIM_UID) is None
        assert api.gets == []
    finally:
        stop(cache, api)
