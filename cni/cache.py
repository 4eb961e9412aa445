"""libcni-compatible attachment cache: `<cache_dir>/results/<network>-<containerID>-<ifname>`."""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, Field, ValidationError

from cni.errors import CNIError, ErrorCode
from cni.fileio import PendingSync, name_problem, start_write, write_atomic
from cni.logs import StepLogger
from cni.models import WireModel, validation_details

CACHE_KIND: Final = "cniCacheV1"
_log = StepLogger("cni")


def _from_base64(value: Any) -> Any:
    """JSON carries `config` as standard base64 (Go's []byte encoding)."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error as err:
            raise ValueError(f"invalid base64: {err}") from None
    return value


class CacheEntry(WireModel):
    """One cached attachment, field for field as libcni writes it."""

    kind: Literal["cniCacheV1"] = CACHE_KIND
    container_id: str = Field(alias="containerId")
    config: Annotated[bytes, BeforeValidator(_from_base64)]
    ifname: str = Field(alias="ifName")
    network_name: str = Field(alias="networkName")
    netns: str = ""
    cni_args: list[tuple[str, str]] = Field(default_factory=list, alias="cniArgs")
    capability_args: dict[str, Any] = Field(default_factory=dict, alias="capabilityArgs")
    result: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        """The file contents; empty optional fields are omitted like libcni's omitempty."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "containerId": self.container_id,
            "config": base64.b64encode(self.config).decode(),
            "ifName": self.ifname,
            "networkName": self.network_name,
        }
        if self.netns:
            out["netns"] = self.netns
        if self.cni_args:
            out["cniArgs"] = [list(pair) for pair in self.cni_args]
        if self.capability_args:
            out["capabilityArgs"] = self.capability_args
        if self.result is not None:
            out["result"] = self.result
        return json.dumps(out).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CacheEntry:
        """Parse a cache file; CNIError(DECODE_FAILURE) if it is not a cniCacheV1 entry."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as err:
            raise CNIError(
                ErrorCode.DECODE_FAILURE, "invalid CNI cache entry", validation_details(err)
            ) from None


class ResultCache:
    """Reads and writes attachment entries under `<cache_dir>/results`."""

    def __init__(self, cache_dir: str | Path) -> None:
        self.cache_dir = Path(cache_dir)
        self.results_dir = self.cache_dir / "results"

    def path(self, network_name: str, container_id: str, ifname: str) -> Path:
        """The file holding one attachment's entry; CNIError(INVALID_CONFIG) if the
        three cannot name one (an ADD checks that before anything is attached)."""
        name = f"{network_name}-{container_id}-{ifname}"
        if not (network_name and container_id and ifname) or "/" in name or "\0" in name:
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"cannot name a cache file after {name!r}",
                "network name, container ID and ifname must be non-empty and contain no '/'",
            )
        if problem := name_problem(name):
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"network name {network_name!r} is too long to name the result cache file "
                f"of container {container_id} ({problem} with the container ID and ifname)",
                f"the file is {name!r}",
            )
        return self.results_dir / name

    def save(self, entry: CacheEntry) -> None:
        """Atomically write an entry (directories 0700, file 0600), not fsync'd."""
        target = self._prepare(entry)
        try:
            write_atomic(target, entry.to_json())
        except OSError as err:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"cannot write CNI cache file {target}", str(err)
            ) from None

    def start_save(self, entry: CacheEntry) -> PendingSync:
        """save(), off the calling thread (fileio.start_write): the entry is in place once
        wait() returns; it raises the OSError of a failed write."""
        return start_write(self._prepare(entry), entry.to_json())

    def _prepare(self, entry: CacheEntry) -> Path:
        """The entry's file, its directories made."""
        target = self.path(entry.network_name, entry.container_id, entry.ifname)
        try:
            self.cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.results_dir.mkdir(mode=0o700, exist_ok=True)
        except OSError as err:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"cannot write CNI cache file {target}", str(err)
            ) from None
        return target

    def load(self, network_name: str, container_id: str, ifname: str) -> CacheEntry | None:
        """The entry, or None if there is none; CNIError if it cannot be read or parsed."""
        if _too_long(network_name, container_id, ifname):
            return None  # no ADD could have saved it
        target = self.path(network_name, container_id, ifname)
        try:
            data = target.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"cannot read CNI cache file {target}", str(err)
            ) from None
        try:
            return CacheEntry.from_json(data)
        except CNIError as err:
            raise CNIError(err.code, f"corrupt CNI cache file {target}", err.details) from None

    def delete(self, network_name: str, container_id: str, ifname: str) -> None:
        """Remove an entry; a missing one is fine."""
        if _too_long(network_name, container_id, ifname):
            return  # no ADD could have saved it: DEL goes on
        target = self.path(network_name, container_id, ifname)
        try:
            target.unlink(missing_ok=True)
        except OSError as err:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"cannot remove CNI cache file {target}", str(err)
            ) from None

    def entries(
        self, network_name: str | None = None, container_id: str | None = None
    ) -> list[CacheEntry]:
        """All readable entries (of one network, one container, if given), in file-name
        order.

        An unreadable file (cut short by a crash, or not an entry) is skipped with a
        warning naming it: it must not stop DEL or GC of the others.
        """
        found, unreadable = self.scan(network_name, container_id)
        for path, err in unreadable.items():
            _log.warning("ignoring unreadable CNI cache file", file=str(path), error=str(err))
        return found

    def scan(
        self, network_name: str | None = None, container_id: str | None = None
    ) -> tuple[list[CacheEntry], dict[Path, CNIError]]:
        """The entries read and the unreadable files (with why), of one network, one
        container, if given: only files whose names could be theirs are read."""
        try:
            names = sorted(os.listdir(self.results_dir))
        except FileNotFoundError:
            return [], {}
        except OSError as err:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"cannot list CNI cache dir {self.results_dir}", str(err)
            ) from None
        found = []
        unreadable: dict[Path, CNIError] = {}
        for name in names:
            if name.startswith("."):
                continue  # write_atomic's temporary files
            if network_name is not None and not name.startswith(f"{network_name}-"):
                continue
            if container_id is not None and f"-{container_id}-" not in name:
                continue
            path = self.results_dir / name
            try:
                entry = CacheEntry.from_json(path.read_bytes())
            except OSError as err:
                unreadable[path] = CNIError(ErrorCode.IO_FAILURE, "cannot read it", str(err))
                continue
            except CNIError as err:
                unreadable[path] = err
                continue
            if not (entry.ifname and entry.network_name and entry.container_id):
                unreadable[path] = CNIError(
                    ErrorCode.DECODE_FAILURE, "entry lacks containerId, ifName or networkName"
                )
            elif network_name in (None, entry.network_name) and container_id in (
                None,
                entry.container_id,
            ):
                found.append(entry)
        return found, unreadable

    def remove_unreadable(self, container_id: str) -> None:
        """Remove the unreadable files named after a container (after its DEL)."""
        for path in self.scan(container_id=container_id)[1]:
            path.unlink(missing_ok=True)


def _too_long(network_name: str, container_id: str, ifname: str) -> bool:
    return name_problem(f"{network_name}-{container_id}-{ifname}") is not None
