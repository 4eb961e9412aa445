"""Attachment records: what ADD attached to a container, saved before any delegate runs.

DEL, CHECK and GC read them, so they keep working after the pod or its NADs are
gone. One JSON file per container ID in `<cniDir>/records/`. ADD makes its record
durable before it returns (Node.make_durable); a record cut short by a crash before
then is unreadable, and DEL and GC treat it as lost (they fall back to the result
cache, then to the pod's networks).
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

    def path(self, container_id: str) -> Path:
        """The file holding one container's record."""
        return self.directory / container_id

    def exists(self, container_id: str) -> bool:
        """True if the container has a record, readable or not."""
        return self.path(container_id).exists()

    def save(self, record: AttachmentRecord) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            write_atomic(self.path(record.container_id), record.model_dump_json().encode())
        except OSError as exc:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"cannot save attachment record in {self.directory}", str(exc)
            ) from exc

    def load(self, container_id: str) -> AttachmentRecord | None:
        """The record, None if there is none; CNIError(IO_FAILURE) if it is unreadable."""
        path = self.path(container_id)
        try:
            return AttachmentRecord.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"cannot read attachment record {path}", _reason(exc)
            ) from exc

    def delete(self, container_id: str) -> None:
        self.path(container_id).unlink(missing_ok=True)

    def scan(self) -> tuple[list[AttachmentRecord], dict[str, CNIError]]:
        """Every record: the readable ones, and the unreadable ones by container ID."""
        records: list[AttachmentRecord] = []
        unreadable: dict[str, CNIError] = {}
        try:
            names = sorted(p.name for p in self.directory.iterdir())
        except FileNotFoundError:
            return records, unreadable
        for name in names:
            if name.startswith("."):
                continue  # write_atomic's temporary files
            try:
                record = self.load(name)
            except CNIError as exc:
                unreadable[name] = exc
                continue
            if record is not None:
                records.append(record)
        return records, unreadable

    def all(self) -> list[AttachmentRecord]:
        """Every readable record."""
        return self.scan()[0]


def _reason(exc: OSError | ValidationError) -> str:
    if isinstance(exc, ValidationError):
        return (
            f"not an attachment record ({exc.error_count()} problem(s): {exc.errors()[0]['msg']})"
        )
    return str(exc)
