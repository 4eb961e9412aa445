"""The daemon's config file: the meta config plus the keys only the daemon reads.

Multus thick's `daemon-config.json` loads as it is once its `type` is `plexus`: each of
Multus's daemon keys is either honoured or refused with a message saying what to do
(docs/migrating-from-multus.md).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cni.errors import CNIError, ErrorCode
from cni.logs import LOGGER_NAME
from cni.models import validation_details
from meta.config import CNI_KEYS, DEFAULT_WRITE_BACKLOG, MULTUS_ONLY_KEYS, MetaConfig

log = logging.getLogger(f"{LOGGER_NAME}.config")

DEFAULT_SOCKET_DIR = "/run/plexus"
GENERATED_NAME = "00-plexus.conflist"
NETWORK_NAME = "plexus-cni-network"
"""The generated conflist's name, and a daemon config's `name` when it has none (Multus's
daemon config has none: multus-daemon names its own config multus-cni-network)."""
MULTUS_AUTO = "auto"
MULTUS_CNI_CONFIG_DIR = "/etc/cni/net.d"
"""multus-daemon's cniConfigDir when `multusConfigFile: auto` comes without one."""


class PerNodeCertificate(BaseModel):
    """Multus's `perNodeCertificate`; only `enabled` matters here (it must be false)."""

    model_config = ConfigDict(extra="allow")

    enabled: bool = False


class DaemonConfig(MetaConfig):
    """`plexus daemon --config FILE`."""

    name: str = NETWORK_NAME
    socket_dir: str = Field(DEFAULT_SOCKET_DIR, alias="socketDir")
    metrics_port: int = Field(9091, alias="metricsPort", ge=0, le=65535)
    metrics_bind_address: str = Field("127.0.0.1", alias="metricsBindAddress")
    max_concurrent_requests: int = Field(32, alias="maxConcurrentRequests", ge=1, le=1024)
    cni_conf_dir: str = Field("", alias="cniConfigDir")
    generated_name: str = Field(GENERATED_NAME, alias="generatedConfigName")
    api_write_backlog: int = Field(DEFAULT_WRITE_BACKLOG, alias="apiWriteBacklog", ge=1, le=65536)
    # The in-process whereabouts IPAM (docs/ipam.md): where its pools live, how often this
    # node's allocations are reconciled and dead nodes' released.
    whereabouts_namespace: str = Field("kube-system", alias="whereaboutsNamespace")
    ipam_reconcile_seconds: float = Field(60.0, alias="ipamReconcileSeconds", gt=0, le=86400)
    ipam_reserve: int = Field(0, alias="ipamReserve", ge=0, le=64)
    # Multus thick's daemon keys: honoured where Plexus does the same, else refused below.
    multus_config_file: str = Field("", alias="multusConfigFile")
    multus_autoconfig_dir: str = Field("", alias="multusAutoconfigDir")
    multus_master_cni: str = Field("", alias="multusMasterCNI")
    force_cni_version: bool = Field(False, alias="forceCNIVersion")
    override_network_name: bool = Field(False, alias="overrideNetworkName")
    daemon_socket_dir: str = Field("", alias="daemonSocketDir")
    per_node_certificate: PerNodeCertificate | None = Field(None, alias="perNodeCertificate")
    auxiliary_cni_chain_name: str = Field("", alias="auxiliaryCNIChainName")

    @model_validator(mode="after")
    def _multus_keys(self) -> DaemonConfig:
        if self.multus_config_file not in ("", MULTUS_AUTO):
            raise ValueError(
                f"multusConfigFile {self.multus_config_file!r}: Plexus does not copy a config "
                "file into cniConfigDir; remove multusConfigFile and set cniConfigDir (the "
                "daemon then writes 00-plexus.conflist there, as multusConfigFile: auto does), "
                "or install your own conflist with a plexus plugin"
            )
        if self.multus_config_file == MULTUS_AUTO and not self.cni_conf_dir:
            self.cni_conf_dir = MULTUS_CNI_CONFIG_DIR
        if self.multus_autoconfig_dir and _dir(self.multus_autoconfig_dir) != _dir(
            self.cni_conf_dir
        ):
            raise ValueError(
                f"multusAutoconfigDir {self.multus_autoconfig_dir!r} differs from cniConfigDir "
                f"{self.cni_conf_dir!r}: Plexus finds the primary network in cniConfigDir and "
                "writes its conflist there; set both to the same directory or remove "
                "multusAutoconfigDir"
            )
        if self.multus_master_cni:
            raise ValueError(
                f"multusMasterCNI {self.multus_master_cni!r}: Plexus wraps the first config "
                "file (sorted by name) in cniConfigDir; remove multusMasterCNI, and to attach "
                "another network as the default set clusterNetwork to its NAD or config name"
            )
        if self.force_cni_version:
            raise ValueError(
                "forceCNIVersion: Plexus never rewrites the primary network's file (its "
                "conflist takes the primary's cniVersion and Plexus speaks every version); "
                "remove forceCNIVersion"
            )
        if self.override_network_name:
            raise ValueError(
                f"overrideNetworkName: the generated conflist is always named {NETWORK_NAME}; "
                "remove overrideNetworkName"
            )
        if self.daemon_socket_dir and _dir(self.daemon_socket_dir) != _dir(self.socket_dir):
            raise ValueError(
                f"daemonSocketDir {self.daemon_socket_dir!r} differs from socketDir "
                f"{self.socket_dir!r}: Plexus's shim reads the socketDir the daemon binds; "
                "mount the host's directory at the same path in the daemon's container, set "
                "socketDir to it and remove daemonSocketDir"
            )
        if self.per_node_certificate is not None and self.per_node_certificate.enabled:
            raise ValueError(
                "perNodeCertificate: Plexus does not request per-node certificates; it uses "
                "kubeconfig or the in-cluster service account (crds/plexus-rbac.yaml): remove "
                "perNodeCertificate"
            )
        if self.auxiliary_cni_chain_name:
            raise ValueError(
                f"auxiliaryCNIChainName {self.auxiliary_cni_chain_name!r}: Plexus runs no "
                "separate chain after the delegates; move its .conf files into "
                "<cniConfigDir>/<primary network name>/ (chained onto the cluster network) "
                "or <cniConfigDir>/plexus-cni-network/ (chained onto Plexus by a libcni 1.3 "
                "runtime), and remove auxiliaryCNIChainName"
            )
        return self


DAEMON_ONLY_KEYS = frozenset(
    field.alias or name
    for name, field in DaemonConfig.model_fields.items()
    if name not in MetaConfig.model_fields
)
"""Keys of the daemon's file that are not meta config keys."""


def _dir(path: str) -> str:
    return os.path.normpath(path) if path else ""


def load_daemon_config(path: str | Path) -> DaemonConfig:
    """Read and validate the daemon's config file; warn once about keys it ignores."""
    try:
        raw = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise CNIError(ErrorCode.IO_FAILURE, f"cannot read {path}", str(exc)) from exc
    except ValueError as exc:
        raise CNIError(ErrorCode.DECODE_FAILURE, f"{path} is not valid JSON", str(exc)) from exc
    if not isinstance(raw, dict):
        raise CNIError(ErrorCode.DECODE_FAILURE, f"{path} must hold a JSON object")
    try:
        conf = DaemonConfig.model_validate(raw)
    except ValidationError as exc:
        raise CNIError(
            ErrorCode.INVALID_CONFIG, f"invalid daemon config {path}", validation_details(exc)
        ) from exc
    _warn_ignored(path, raw)
    return conf


def _warn_ignored(path: str | Path, raw: dict[str, Any]) -> None:
    known = {field.alias or name for name, field in DaemonConfig.model_fields.items()}
    unknown = sorted(raw.keys() - known - CNI_KEYS - MULTUS_ONLY_KEYS)
    if unknown:
        log.warning(
            "unknown daemon config keys ignored: %s",
            ", ".join(unknown),
            extra={"file": str(path), "keys": unknown},
        )
    if "logOptions" in raw:
        log.warning(
            "logOptions ignored: Plexus does not rotate logFile; rotate it with logrotate's "
            "copytruncate",
            extra={"file": str(path)},
        )
