"""The sriov-network-operator's custom resources (sriovnetwork.openshift.io/v1), typed.

Field names and defaults are the operator's (an unset `priority` is 0, the highest). The
API server has checked each object against crds/sriovnetwork-crds.yaml; `from_api` still
refuses what does not parse (`CRError`), so one bad object cannot stop the others.
`PfConfig` and `VfGroup` are one PF's desired config, as SriovNetworkNodeState's
`spec.interfaces` shows it, plus what the device plugin pool needs.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

GROUP = "sriovnetwork.openshift.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
NETDEVICE = "netdevice"
VFIO_PCI = "vfio-pci"

Json = dict[str, Any]
M = TypeVar("M", bound=BaseModel)


class CRError(ValueError):
    """An object that does not parse; the message names it and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="ignore")


class NicSelector(_Model):
    vendor: str = ""
    device_id: str = Field("", alias="deviceID")
    root_devices: tuple[str, ...] = Field((), alias="rootDevices")
    pf_names: tuple[str, ...] = Field((), alias="pfNames")
    net_filter: str = Field("", alias="netFilter")

    def empty(self) -> bool:
        return not (
            self.vendor or self.device_id or self.root_devices or self.pf_names or self.net_filter
        )


class PolicySpec(_Model):
    resource_name: str = Field(alias="resourceName")
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    priority: int = 0
    mtu: int = 0
    num_vfs: int = Field(alias="numVfs")
    nic_selector: NicSelector = Field(alias="nicSelector")
    device_type: str = Field(NETDEVICE, alias="deviceType")
    is_rdma: bool = Field(False, alias="isRdma")
    need_vhost_net: bool = Field(False, alias="needVhostNet")
    link_type: str = Field("", alias="linkType")
    e_switch_mode: str = Field("", alias="eSwitchMode")
    exclude_topology: bool = Field(False, alias="excludeTopology")
    externally_managed: bool = Field(False, alias="externallyManaged")


class NodePolicy(_Model):
    """A SriovNetworkNodePolicy."""

    name: str
    namespace: str
    created: str = ""  # metadata.creationTimestamp (RFC 3339 sorts as text)
    spec: PolicySpec

    @classmethod
    def from_api(cls, obj: Json) -> NodePolicy:
        return _parse(cls, obj)


class LabelRequirement(_Model):
    key: str
    operator: str
    values: tuple[str, ...] = ()


class LabelSelector(_Model):
    """A metav1.LabelSelector; None as a pool's nodeSelector matches no node."""

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[LabelRequirement, ...] = Field((), alias="matchExpressions")

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            present, value = req.key in labels, labels.get(req.key)
            ok = {
                "In": present and value in req.values,
                "NotIn": not present or value not in req.values,
                "Exists": present,
                "DoesNotExist": not present,
            }.get(req.operator, False)
            if not ok:
                return False
        return True


class PoolSpec(_Model):
    node_selector: LabelSelector | None = Field(None, alias="nodeSelector")
    max_unavailable: int | str | None = Field(None, alias="maxUnavailable")


class PoolConfig(_Model):
    """A SriovNetworkPoolConfig."""

    name: str
    namespace: str
    spec: PoolSpec

    @classmethod
    def from_api(cls, obj: Json) -> PoolConfig:
        return _parse(cls, obj)


class NetworkSpec(_Model):
    network_namespace: str = Field("", alias="networkNamespace")
    resource_name: str = Field(alias="resourceName")
    capabilities: str = ""
    ipam: str = ""
    vlan: int = 0
    vlan_qos: int = Field(0, alias="vlanQoS")
    vlan_proto: str = Field("", alias="vlanProto")
    spoof_chk: str = Field("", alias="spoofChk")
    trust: str = ""
    link_state: str = Field("", alias="linkState")
    min_tx_rate: int | None = Field(None, alias="minTxRate")
    max_tx_rate: int | None = Field(None, alias="maxTxRate")
    meta_plugins: str = Field("", alias="metaPlugins")
    log_level: str = Field("", alias="logLevel")
    log_file: str = Field("", alias="logFile")


class SriovNetwork(_Model):
    """A SriovNetwork."""

    name: str
    namespace: str
    uid: str = ""
    generation: int = 0
    deleting: bool = False  # metadata.deletionTimestamp is set
    finalizers: tuple[str, ...] = ()
    annotations: dict[str, str] = Field(default_factory=dict)
    spec: NetworkSpec

    @classmethod
    def from_api(cls, obj: Json) -> SriovNetwork:
        return _parse(cls, obj)


class VfGroup(_Model):
    """VFs `first`..`last` of a PF and the resource they fill."""

    resource_name: str = Field(alias="resourceName")
    device_type: str = Field(NETDEVICE, alias="deviceType")
    first: int
    last: int
    policy_name: str = Field(alias="policyName")
    mtu: int = 0
    is_rdma: bool = Field(False, alias="isRdma")
    need_vhost_net: bool = Field(False, alias="needVhostNet")
    exclude_topology: bool = Field(False, alias="excludeTopology")
    link_type: str = Field("", alias="linkType")

    @property
    def vf_range(self) -> str:
        return f"{self.first}-{self.last}"

    def overlaps(self, other: VfGroup) -> bool:
        return self.first <= other.last and other.first <= self.last

    def spec(self) -> Json:
        """The node state's `spec.interfaces[].vfGroups[]` entry."""
        out: Json = {
            "resourceName": self.resource_name,
            "deviceType": self.device_type,
            "vfRange": self.vf_range,
            "policyName": self.policy_name,
        }
        if self.mtu:
            out["mtu"] = self.mtu
        if self.is_rdma:
            out["isRdma"] = True
        return out


class PfConfig(_Model):
    """One PF's desired config after the node's policies are merged."""

    pci_address: str = Field(alias="pciAddress")
    name: str = ""
    num_vfs: int = Field(0, alias="numVfs")
    mtu: int = 0
    link_type: str = Field("", alias="linkType")
    externally_managed: bool = Field(False, alias="externallyManaged")
    vf_groups: tuple[VfGroup, ...] = Field((), alias="vfGroups")

    def group_of(self, index: int) -> VfGroup | None:
        return next((g for g in self.vf_groups if g.first <= index <= g.last), None)

    def spec(self) -> Json:
        """The node state's `spec.interfaces[]` entry."""
        out: Json = {"pciAddress": self.pci_address, "numVfs": self.num_vfs}
        if self.name:
            out["name"] = self.name
        if self.mtu:
            out["mtu"] = self.mtu
        if self.link_type:
            out["linkType"] = self.link_type
        if self.externally_managed:
            out["externallyManaged"] = True
        out["vfGroups"] = [g.spec() for g in self.vf_groups]
        return out


def _parse(cls: type[M], obj: Json) -> M:
    meta = obj.get("metadata") or {}
    fields = {
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
        "created": meta.get("creationTimestamp", ""),
        "uid": meta.get("uid", ""),
        "generation": meta.get("generation", 0),
        "deleting": bool(meta.get("deletionTimestamp")),
        "finalizers": meta.get("finalizers") or (),
        "annotations": meta.get("annotations") or {},
        "spec": obj.get("spec") or {},
    }
    try:
        return cls.model_validate({k: v for k, v in fields.items() if k in cls.model_fields})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        kind = obj.get("kind", cls.__name__)
        raise CRError(
            f"{kind} {fields['namespace']}/{fields['name']}: {where}: {err['msg']}"
        ) from None
