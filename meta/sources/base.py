"""The cluster-source interface the engine uses (pods, NADs, DRA claims) and its objects."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field, model_validator

CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
CONFIG_MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
RESOURCE_NAME_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"


class PodClaim(BaseModel):
    """One entry of a pod's `spec.resourceClaims` (DRA), with the ResourceClaim it names.

    `claim` is `resourceClaimName`, or for a `resourceClaimTemplateName` the name the
    controller generated (from `status.resourceClaimStatuses`): None while it has not
    generated one, "" when it reported that none was needed.
    """

    name: str
    claim: str | None = None
    template: bool = False


class Pod(BaseModel):
    """The parts of a pod the meta-plugin needs."""

    namespace: str
    name: str
    uid: str = ""
    annotations: dict[str, str] = Field(default_factory=dict)
    node_name: str = ""
    static: bool = False  # made by the kubelet, not the API server; also set from annotations
    resource_claims: list[PodClaim] = Field(default_factory=list)

    @model_validator(mode="after")
    def _detect_static(self) -> Pod:
        """Static pods: config source other than "api", or a mirror-pod annotation."""
        source = self.annotations.get(CONFIG_SOURCE_ANNOTATION, "api")
        if source != "api" or CONFIG_MIRROR_ANNOTATION in self.annotations:
            self.static = True
        return self


class NetworkAttachmentDefinition(BaseModel):
    """A `k8s.cni.cncf.io/v1` NetworkAttachmentDefinition; `config` may be empty."""

    namespace: str
    name: str
    config: str = ""
    annotations: dict[str, str] = Field(default_factory=dict)

    @property
    def resource_name(self) -> str | None:
        """The device-plugin resource this network's devices come from, if any."""
        return self.annotations.get(RESOURCE_NAME_ANNOTATION) or None


class ClaimDevice(BaseModel):
    """One allocated device of a pod's claim that carries the Multus attributes."""

    namespace: str
    claim: str
    uid: str
    driver: str
    pool: str
    device: str
    share_id: str = ""
    resource_name: str
    device_id: str


class ClaimSource(Protocol):
    """Reads a pod's claims (with the attributes of their devices), writes claim status."""

    def claim_devices(self, pod: Pod) -> list[ClaimDevice]:
        """The pod's allocated devices that carry the Multus attributes; CNIError when a
        claim cannot be read, does not exist or is not allocated."""
        ...

    def set_device_status(
        self, namespace: str, claim: str, uid: str, devices: list[dict[str, Any]]
    ) -> None:
        """Apply `status.devices` entries to a claim, bounded as the network-status write."""
        ...


class ClusterSource(Protocol):
    """Read pods and NADs, write the network-status annotation, record events.

    Failures are raised as CNIError; an object that does not exist is None, not an error.
    """

    def get_pod(self, namespace: str, name: str, wait: bool = True) -> Pod | None:
        """The pod, or None if there is no such pod.

        `wait`: a pod just created may not have reached a cache yet; a source with one
        waits a little for it. DEL and hot-plug look up pods that exist or are gone, and
        pass False.
        """
        ...

    def get_nad(self, namespace: str, name: str) -> NetworkAttachmentDefinition | None:
        """The NetworkAttachmentDefinition, or None if there is none."""
        ...

    def set_network_status(self, pod: Pod, value: str) -> None:
        """Write the network-status annotation value; a pod that is gone is not an error.

        Returns within a short bound: a source with a background writer hands a write
        the server has not answered by then to it (the call succeeds).
        """
        ...

    def record_event(self, pod: Pod, type_: str, reason: str, message: str) -> None:
        """Record a pod event; `type_` is "Normal" or "Warning".

        Best effort and never in the caller's way: a source may write it later (the API
        server's, from a background queue); a failure is logged, never raised.
        """
        ...

    def claims(self) -> ClaimSource | None:
        """Where pods' DRA ResourceClaims are read and their status written; None if the
        source has none (the embedded store)."""
        ...
