"""The pods behind the holders of VFs a change must touch, and their eviction.

Eviction goes through the Eviction API, so the API server applies PodDisruptionBudgets: a
refusal (429) leaves the pod running and the change waiting. A holder known by UID only
(the kubelet's checkpoint) is found among the node's pods; a DRA claim's pods are its
`status.reservedFor`.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

from deviceplugin.provision.holders import Holder
from kube.api import APIError, KubeAPI

CLAIM = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"


@dataclass(frozen=True, order=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def pods_of(api: KubeAPI, node: str, holders: Iterable[Holder]) -> tuple[set[PodRef], set[str]]:
    """The pods holding the VFs, and the holders that name no pod (these cannot be evicted)."""
    pods: set[PodRef] = set()
    unnamed: set[str] = set()
    by_uid: dict[str, PodRef] | None = None
    for holder in holders:
        if holder.claim:
            pods |= _claim_pods(api, holder)
        elif holder.name:
            pods.add(PodRef(holder.namespace, holder.name))
        elif holder.uid:
            if by_uid is None:
                by_uid = _node_pods(api, node)
            if holder.uid in by_uid:
                pods.add(by_uid[holder.uid])
        else:
            unnamed.add(str(holder))
    return pods, unnamed


def _node_pods(api: KubeAPI, node: str) -> dict[str, PodRef]:
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}"})
    listed = api.request("GET", f"/api/v1/pods?{query}")
    return {
        p["metadata"]["uid"]: PodRef(p["metadata"]["namespace"], p["metadata"]["name"])
        for p in listed.get("items", [])
    }


def _claim_pods(api: KubeAPI, holder: Holder) -> set[PodRef]:
    try:
        claim = api.request("GET", CLAIM.format(ns=holder.namespace, name=holder.name))
    except APIError as exc:
        if exc.status == 404:
            return set()  # gone: its VFs come back when the kubelet unprepares it
        raise
    return {
        PodRef(holder.namespace, r["name"])
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if r.get("resource") == "pods"
    }


def evict(api: KubeAPI, pod: PodRef) -> str:
    """Ask the API server to evict `pod`: "" when it went (or is going), else why not."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
    }
    try:
        api.request("POST", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/eviction", body)
    except APIError as exc:
        if exc.status == 404:
            return ""
        return f"eviction of pod {pod} refused: {_message(exc)}"
    return ""


def _message(exc: APIError) -> str:
    text = str(exc).removeprefix(f"HTTP {exc.status}: ")
    try:
        return str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        return text
