"""A cluster source over a directory of Kubernetes manifests, for clusterless nodes and demos.

One object per `.yaml`, `.yml` or `.json` file: `v1` Pods and `k8s.cni.cncf.io/v1`
NetworkAttachmentDefinitions. The directory is scanned on every look-up, in file-name
order (the first file naming an object wins). Files that do not parse, and other
kinds, are skipped with a warning; a Pod or NAD that is malformed is an error when it
is asked for. Status writes replace the pod's file atomically under a lock in the
directory; YAML comments are not kept. Events are appended as JSON lines to
`events.log`.
"""

from __future__ import annotations

import copy
import fcntl
import json
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError

from cni import jsonio
from cni.errors import CNIError, ErrorCode
from cni.fileio import write_atomic
from meta.sources.base import ClusterSource, NetworkAttachmentDefinition, Pod
from meta.status import NETWORK_STATUS_ANNOTATION

log = logging.getLogger("plexus.store")

EVENTS_FILE = "events.log"
LOCK_FILE = ".plexus-store.lock"
_SUFFIXES = (".yaml", ".yml", ".json")
_POD = ("v1", "Pod")
_NAD = ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition")


class _Metadata(BaseModel):
    name: str
    namespace: str | None = None
    uid: str | None = None
    annotations: dict[str, str] | None = None


class _PodSpec(BaseModel):
    node_name: str | None = Field(default=None, alias="nodeName")


class _PodManifest(BaseModel):
    metadata: _Metadata
    spec: _PodSpec | None = None


class _NADSpec(BaseModel):
    config: str | None = None


class _NADManifest(BaseModel):
    metadata: _Metadata
    spec: _NADSpec | None = None


_Manifest = TypeVar("_Manifest", _PodManifest, _NADManifest)


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Safe dumper writing multi-line strings (the network-status value) as `|` blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


class EmbeddedStore(ClusterSource):
    """Pods and NADs from manifests in `directory`; status and events written back there."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        # Parsed files by path, reused while (mtime, size) is unchanged: a daemon asks often.
        self._parsed: dict[Path, tuple[tuple[int, int], dict[str, Any] | None]] = {}

    def get_pod(self, namespace: str, name: str, wait: bool = True) -> Pod | None:
        found = self._find(_POD, namespace, name)
        if found is None:
            return None
        path, body = found
        manifest = _validate(_PodManifest, body, path)
        spec = manifest.spec or _PodSpec()
        return Pod(
            namespace=namespace,
            name=name,
            uid=manifest.metadata.uid or "",
            annotations=manifest.metadata.annotations or {},
            node_name=spec.node_name or "",
        )

    def pods(self) -> list[Pod]:
        """Every well-formed pod in the directory (for watching; malformed ones skipped)."""
        found = []
        for _, body in self._objects():
            if (body.get("apiVersion"), body.get("kind")) != _POD:
                continue
            metadata = body["metadata"]
            try:
                pod = self.get_pod(metadata.get("namespace") or "default", metadata["name"])
            except CNIError:
                continue
            if pod is not None:
                found.append(pod)
        return found

    def get_nad(self, namespace: str, name: str) -> NetworkAttachmentDefinition | None:
        found = self._find(_NAD, namespace, name)
        if found is None:
            return None
        path, body = found
        manifest = _validate(_NADManifest, body, path)
        spec = manifest.spec or _NADSpec()
        return NetworkAttachmentDefinition(
            namespace=namespace,
            name=name,
            config=spec.config or "",
            annotations=manifest.metadata.annotations or {},
        )

    def set_network_status(self, pod: Pod, value: str) -> None:
        with self._locked():
            found = self._find(_POD, pod.namespace, pod.name)
            if found is None:
                log.warning(
                    "pod %s/%s is gone; network-status not written", pod.namespace, pod.name
                )
                return
            path, body = found[0], copy.deepcopy(found[1])
            metadata = body["metadata"]
            annotations = metadata.get("annotations") or {}
            if not isinstance(annotations, dict):
                raise CNIError(
                    ErrorCode.INVALID_CONFIG, f"{path}: metadata.annotations is not a map"
                )
            annotations[NETWORK_STATUS_ANNOTATION] = value
            metadata["annotations"] = annotations
            self._replace(path, body)

    def record_event(self, pod: Pod, type_: str, reason: str, message: str) -> None:
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        event = {
            "time": now,
            "namespace": pod.namespace,
            "pod": pod.name,
            "type": type_,
            "reason": reason,
            "message": message,
        }
        path = self.directory / EVENTS_FILE
        try:  # a file append is quick: written now, but like any source's, never raised
            with path.open("a", encoding="utf-8") as stream:
                fcntl.flock(stream, fcntl.LOCK_EX)
                stream.write(json.dumps(event) + "\n")
        except OSError as exc:
            log.warning("event not recorded: cannot append to %s: %s", path, exc)

    def claims(self) -> None:
        """The embedded store holds no ResourceClaims."""
        return None

    def _find(
        self, kind: tuple[str, str], namespace: str, name: str
    ) -> tuple[Path, dict[str, Any]] | None:
        for path, body in self._objects():
            metadata = body["metadata"]
            if (
                (body.get("apiVersion"), body.get("kind")) == kind
                and metadata["name"] == name
                and (metadata.get("namespace") or "default") == namespace
            ):
                return path, body
        return None

    def _objects(self) -> Iterator[tuple[Path, dict[str, Any]]]:
        """Pod and NAD manifests that name themselves, in file-name order."""
        try:
            paths = sorted(self.directory.iterdir())
        except OSError as exc:
            raise CNIError(ErrorCode.IO_FAILURE, f"cannot list {self.directory}: {exc}") from exc
        for path in paths:
            if path.suffix not in _SUFFIXES or path.name.startswith("."):
                continue
            body = self._load_cached(path)
            if body is None:
                continue
            kind = (body.get("apiVersion"), body.get("kind"))
            metadata = body.get("metadata")
            if kind not in (_POD, _NAD):
                log.warning("%s: skipped: not a Pod or NetworkAttachmentDefinition", path)
            elif not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
                log.warning("%s: skipped: no metadata.name", path)
            else:
                yield path, body

    def _load_cached(self, path: Path) -> dict[str, Any] | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CNIError(ErrorCode.IO_FAILURE, f"cannot read {path}: {exc}") from exc
        key = (st.st_mtime_ns, st.st_size)
        cached = self._parsed.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        body = _load(path)
        self._parsed[path] = (key, body)
        return body

    @contextmanager
    def _locked(self) -> Iterator[None]:
        path = self.directory / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CNIError(ErrorCode.IO_FAILURE, f"cannot open lock file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _replace(self, path: Path, body: dict[str, Any]) -> None:
        """Rewrite `path` in its own format via a temporary file and rename."""
        if path.suffix == ".json":
            text = json.dumps(body, indent=2, ensure_ascii=False) + "\n"
        else:
            text = yaml.dump(body, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
        try:
            write_atomic(path, text.encode(), stat.S_IMODE(path.stat().st_mode), fsync=True)
        except OSError as exc:
            raise CNIError(ErrorCode.IO_FAILURE, f"cannot write {path}: {exc}") from exc


def _load(path: Path) -> dict[str, Any] | None:
    """The file's object; None (with a warning) if it is gone or does not parse."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        log.warning("%s: skipped: %s", path, exc)
        return None
    except OSError as exc:
        raise CNIError(ErrorCode.IO_FAILURE, f"cannot read {path}: {exc}") from exc
    try:
        body = (
            jsonio.loads(text, str(path))
            if path.suffix == ".json"
            else yaml.load(text, Loader=_Loader)
        )
    except (ValueError, yaml.YAMLError) as exc:
        log.warning("%s: skipped: does not parse: %s", path, exc)
        return None
    if not isinstance(body, dict):
        log.warning("%s: skipped: not a Kubernetes object", path)
        return None
    return body


def _validate(model: type[_Manifest], body: dict[str, Any], path: Path) -> _Manifest:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        problem = "Input should be a map" if error["type"] == "model_type" else error["msg"]
        kind, name = body.get("kind"), body["metadata"]["name"]
        raise CNIError(
            ErrorCode.INVALID_CONFIG, f"{path}: {kind} {name}: {where}: {problem}"
        ) from exc
