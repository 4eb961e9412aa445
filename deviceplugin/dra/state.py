"""What this node has prepared, on disk: one JSON file per claim UID.

Prepare writes a claim's file (atomically, fsynced) before it answers the kubelet, and
Unprepare removes it last, so after a restart of the plugin a repeated Prepare returns
what was prepared before and a repeated Unprepare finds what to undo, or nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from cni import jsonio
from cni.fileio import write_atomic

_UID = re.compile(r"^[A-Za-z0-9-]+$")


class PreparedDevice(BaseModel):
    """One allocated VF as prepared for a claim."""

    model_config = ConfigDict(frozen=True)

    request: str
    pool: str
    device: str
    address: str
    resource: str
    driver_before: str  # the driver it had, restored by Unprepare
    driver: str  # the driver Prepare left it with
    cdi_id: str


class PreparedClaim(BaseModel):
    model_config = ConfigDict(frozen=True)

    uid: str
    namespace: str
    name: str
    cdi_spec: str  # the spec file's path
    devices: list[PreparedDevice]


class PreparedState:
    """The claim files under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, uid: str) -> Path:
        if not _UID.match(uid):
            raise ValueError(f"claim UID {uid!r} is not a UID")
        return self.directory / f"{uid}.json"

    def get(self, uid: str) -> PreparedClaim | None:
        try:
            data = self._path(uid).read_bytes()
        except FileNotFoundError:
            return None
        return PreparedClaim.model_validate(jsonio.loads(data, str(self._path(uid))))

    def put(self, claim: PreparedClaim, fsync: bool = True) -> Path:
        """Write a claim's file; without `fsync` the caller makes it durable (make_durable)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(claim.uid)
        write_atomic(path, claim.model_dump_json().encode(), fsync=fsync)
        return path

    def remove(self, uid: str) -> None:
        self._path(uid).unlink(missing_ok=True)
