"""The meta-plugin's own CNI config: Multus's keys plus Plexus's."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cni import deviceinfo, jsonio
from cni.errors import CNIError, ErrorCode
from cni.logs import LOGGER_NAME
from cni.models import validation_details
from meta.podresources import checkpoint, client

log = logging.getLogger(f"{LOGGER_NAME}.config")

DEFAULT_CNI_DIR = "/var/lib/cni/plexus"
DEFAULT_CONF_DIR = "/etc/cni/multus/net.d"
DEFAULT_GLOBAL_NAMESPACES = ("default",)
"""Multus's globalNamespaces when it is unset or empty (GetDefaultNetConf)."""
DEFAULT_WRITE_TIMEOUT = 2.0  # apiWriteTimeout, seconds
DEFAULT_WRITE_BACKLOG = 1024  # the daemon's apiWriteBacklog: API writes waiting in the background
DEFAULT_ALLOWED_HOST_PATHS = ("/var/lib/cni", "/run/cni", "/etc/cni/net.d/whereabouts.d")
"""Where a NAD may point plugins' host paths (meta/policy.py): CNI state, the dhcp
daemon's socket, whereabouts' own config."""

CNI_KEYS = frozenset(
    {
        "cniVersion",
        "name",
        "type",
        "capabilities",
        "runtimeConfig",
        "prevResult",
        "args",
        "ipam",
        "dns",
        "cni.dev/valid-attachments",
        "cni.dev/attachments",
    }
)
"""Keys the CNI spec and its conventions put into any plugin's config."""
MULTUS_ONLY_KEYS = frozenset({"logOptions"})
"""Multus keys Plexus reads nothing from (log rotation is the host's business)."""
DAEMON_KEYS = frozenset(
    {
        "socketDir",
        "metricsPort",
        "metricsBindAddress",
        "maxConcurrentRequests",
        "cniConfigDir",
        "generatedConfigName",
        "apiWriteBacklog",
        "multusConfigFile",
        "multusAutoconfigDir",
        "multusMasterCNI",
        "forceCNIVersion",
        "overrideNetworkName",
        "daemonSocketDir",
        "perNodeCertificate",
        "auxiliaryCNIChainName",
        "whereaboutsNamespace",
        "ipamReconcileSeconds",
        "ipamReserve",
    }
)
"""meta.daemon.config.DaemonConfig's own keys (the shim reads socketDir from every call)."""


class MetaConfig(BaseModel):
    """`{"type": "plexus", ...}` as the runtime hands it to us on stdin."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    cni_version: str = Field(alias="cniVersion")
    name: str
    type: str
    delegates: list[dict[str, Any]] = Field(default_factory=list)
    cluster_network: str = Field("", alias="clusterNetwork")
    default_networks: list[str] = Field(default_factory=list, alias="defaultNetworks")
    system_namespaces: list[str] = Field(default=["kube-system"], alias="systemNamespaces")
    multus_namespace: str = Field("kube-system", alias="multusNamespace")
    namespace_isolation: bool = Field(False, alias="namespaceIsolation")
    global_namespaces: list[str] = Field(
        default=list(DEFAULT_GLOBAL_NAMESPACES), alias="globalNamespaces"
    )
    max_networks_per_pod: int = Field(32, ge=1, alias="maxNetworksPerPod")
    conf_dir: str = Field(DEFAULT_CONF_DIR, alias="confDir")
    cni_dir: str = Field(DEFAULT_CNI_DIR, alias="cniDir")
    bin_dir: str = Field("", alias="binDir")
    chroot_dir: str = Field("", alias="chrootDir")
    exec_delegates: list[str] = Field(default_factory=list, alias="execDelegates")
    readiness_indicator_file: str = Field("", alias="readinessindicatorfile")
    log_file: str = Field("", alias="logFile")
    log_level: str = Field("info", alias="logLevel")
    log_to_stderr: bool = Field(True, alias="logToStderr")
    retry_delete_on_error: bool = Field(False, alias="retryDeleteOnError")
    delegate_timeout: float = Field(30.0, alias="delegateTimeoutSeconds", gt=0, le=600)
    daemon_wait: float = Field(10.0, alias="daemonWaitSeconds", ge=0, le=600)
    kubeconfig: str = ""
    # An ADD waits this long for its network-status write; the daemon then leaves it to
    # its background queue, thin mode fails with code 11 (docs/configuration.md).
    api_write_timeout: float = Field(DEFAULT_WRITE_TIMEOUT, alias="apiWriteTimeout", gt=0, le=60)
    cluster_dir: str = Field("", alias="clusterDir")
    device_info_dir: str = Field(deviceinfo.DEFAULT_DIR, alias="deviceInfoDir")
    pod_resources_socket: str = Field(client.DEFAULT_SOCKET, alias="podResourcesSocket")
    device_checkpoint_file: str = Field(checkpoint.DEFAULT_CHECKPOINT, alias="deviceCheckpointFile")
    allowed_host_paths: list[str] = Field(
        default=list(DEFAULT_ALLOWED_HOST_PATHS), alias="allowedHostPaths"
    )
    trust_system_namespaces: bool = Field(False, alias="trustSystemNamespaces")
    runtime_config: dict[str, Any] = Field(default_factory=dict, alias="runtimeConfig")
    capabilities: dict[str, bool] = Field(default_factory=dict)

    @field_validator("global_namespaces", "system_namespaces", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        # Multus writes these as one comma-separated string; accept both forms.
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("global_namespaces")
    @classmethod
    def _empty_is_unset(cls, value: list[str]) -> list[str]:
        return value or list(DEFAULT_GLOBAL_NAMESPACES)  # as Multus reads an empty string

    @field_validator("allowed_host_paths")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/"):
                raise ValueError(f"allowedHostPaths: {path!r} is not an absolute path")
        return value

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.lower()
        if level not in {"debug", "verbose", "info", "warning", "error", "panic"}:
            raise ValueError(f"unknown logLevel {value!r}")
        return level

    @property
    def has_cluster(self) -> bool:
        """True when pods and NADs come from a cluster source."""
        return bool(self.kubeconfig or self.cluster_dir)

    def namespace_allowed(self, pod_namespace: str, network_namespace: str) -> bool:
        """namespaceIsolation: a pod may use only its own or a global namespace's NADs."""
        if not self.namespace_isolation or pod_namespace == network_namespace:
            return True
        return network_namespace in self.global_namespaces


KNOWN_KEYS = (
    frozenset(field.alias or name for name, field in MetaConfig.model_fields.items())
    | CNI_KEYS
    | MULTUS_ONLY_KEYS
    | DAEMON_KEYS
)
_MAX_WARNED = 64
_warned: set[frozenset[str]] = set()


def _warn_unknown(extra: dict[str, Any]) -> None:
    """One warning naming the unknown keys, once per distinct set of them (per process).

    Costs a set difference per call: the daemon parses the config on every call.
    """
    unknown = frozenset(extra.keys() - KNOWN_KEYS)
    if not unknown or unknown in _warned or len(_warned) >= _MAX_WARNED:
        return
    _warned.add(unknown)
    names = ", ".join(repr(key) for key in sorted(unknown))
    plural = "s" if len(unknown) > 1 else ""
    log.warning(
        "unknown meta config key%s %s ignored", plural, names, extra={"keys": sorted(unknown)}
    )


def load_meta_config(data: bytes) -> MetaConfig:
    """Parse the meta-plugin config from the runtime's stdin."""
    raw = jsonio.loads(data, "the plexus config")
    if not isinstance(raw, dict):
        raise CNIError(ErrorCode.DECODE_FAILURE, "the plexus config must be a JSON object")
    try:
        conf = MetaConfig.model_validate(raw)
    except ValidationError as exc:
        raise CNIError(
            ErrorCode.INVALID_CONFIG, "invalid plexus config", validation_details(exc)
        ) from exc
    if not conf.delegates and not conf.cluster_network:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            "invalid plexus config: set clusterNetwork or at least one entry in delegates",
        )
    if conf.model_extra:
        _warn_unknown(conf.model_extra)
    return conf
