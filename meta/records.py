"""Attachment records: what ADD attached to a container, saved before any delegate runs.

DEL, CHECK and GC read them, so they keep working after the pod or its NADs are
gone. One JSON file per container ID in `<cniDir>/records/`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from cni.errors import CNIError, ErrorCode
from cni.fileio import write_atomic
from meta.delegate import Delegate


class AttachmentRecord(BaseModel):
    """Everything needed to undo or verify one container's attachments."""

    container_id: str
    netns: str
    ifname: str
    pod_namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    cni_args: list[tuple[str, str]] = Field(default_factory=list)
    path: list[str] = Field(default_factory=list, description="CNI_PATH of the ADD")
    delegates: list[Delegate]


class RecordStore:
    """Attachment records on disk, written atomically."""

    def __init__(self, cni_dir: str | Path) -> None:
        self.directory = Path(cni_dir) / "records"

    def _path(self, container_id: str) -> Path:
        return self.directory / container_id

    def save(self, record: AttachmentRecord) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            write_atomic(self._path(record.container_id), record.model_dump_json().encode())
        except OSError as exc:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"cannot save attachment record in {self.directory}", str(exc)
            ) from exc

    def load(self, container_id: str) -> AttachmentRecord | None:
        path = self._path(container_id)
        try:
            return AttachmentRecord.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"cannot read attachment record {path}", str(exc)
            ) from exc

    def delete(self, container_id: str) -> None:
        self._path(container_id).unlink(missing_ok=True)

    def all(self) -> list[AttachmentRecord]:
        """Every readable record (unreadable ones are skipped)."""
        records: list[AttachmentRecord] = []
        if not self.directory.is_dir():
            return records
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith("."):
                continue
            try:
                records.append(AttachmentRecord.model_validate_json(path.read_bytes()))
            except (OSError, ValidationError):
                continue
        return records
