"""The daemon's config file: the meta config plus the keys only the daemon reads."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field, ValidationError

from cni.errors import CNIError, ErrorCode
from cni.models import validation_details
from meta.config import DEFAULT_WRITE_BACKLOG, MetaConfig

DEFAULT_SOCKET_DIR = "/run/plexus"
GENERATED_NAME = "00-plexus.conflist"


class DaemonConfig(MetaConfig):
    """`plexus daemon --config FILE`."""

    socket_dir: str = Field(DEFAULT_SOCKET_DIR, alias="socketDir")
    metrics_port: int = Field(9091, alias="metricsPort", ge=0, le=65535)
    metrics_bind_address: str = Field("127.0.0.1", alias="metricsBindAddress")
    max_concurrent_requests: int = Field(32, alias="maxConcurrentRequests", ge=1, le=1024)
    cni_conf_dir: str = Field("", alias="cniConfigDir")
    generated_name: str = Field(GENERATED_NAME, alias="generatedConfigName")
    api_write_backlog: int = Field(DEFAULT_WRITE_BACKLOG, alias="apiWriteBacklog", ge=1, le=65536)


def load_daemon_config(path: str | Path) -> DaemonConfig:
    """Read and validate the daemon's config file."""
    try:
        raw = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise CNIError(ErrorCode.IO_FAILURE, f"cannot read {path}", str(exc)) from exc
    except ValueError as exc:
        raise CNIError(ErrorCode.DECODE_FAILURE, f"{path} is not valid JSON", str(exc)) from exc
    try:
        return DaemonConfig.model_validate(raw)
    except ValidationError as exc:
        raise CNIError(
            ErrorCode.INVALID_CONFIG, f"invalid daemon config {path}", validation_details(exc)
        ) from exc
