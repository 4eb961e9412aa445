"""What Plexus did to each PF, on the node: one JSON file per PF under the agent's state dir.

A PF's record is written before the first change to it, so a crash mid-way still leaves a
record to undo; it says whether Plexus created the PF's VFs, the PF's MTU before Plexus
raised it, and the config last applied. Removing a policy resets only PFs with a record
(never externally managed ones), whatever happened while the agent was down, and at boot
the recorded configs are applied before the device plugin advertises anything. The
directory comes from the agent's own options, never from a custom resource.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cni import jsonio
from cni.fileio import write_atomic
from deviceplugin.provision.crs import PfConfig

_PCI = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


class PfRecord(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)

    pci_address: str = Field(alias="pciAddress")
    externally_managed: bool = Field(False, alias="externallyManaged")
    created_vfs: bool = Field(False, alias="createdVfs")  # Plexus wrote sriov_numvfs
    original_mtu: int | None = Field(None, alias="originalMtu")  # before Plexus raised it
    config: PfConfig
    applied: bool = False  # the host matched `config` once: a later mismatch is drift


class RecordError(ValueError):
    """A record file that cannot be read; the message names it."""


class Records:
    """The record files in `directory` (`<pci>.json`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, pci: str) -> Path:
        if not _PCI.match(pci):
            raise ValueError(f"{pci!r} is not a PCI address")
        return self.directory / f"{pci}.json"

    def load(self) -> dict[str, PfRecord]:
        """Every record by PCI address; RecordError for one that does not parse."""
        out: dict[str, PfRecord] = {}
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return out
        for name in names:
            if not name.endswith(".json"):
                continue
            path = self.directory / name
            try:
                record = PfRecord.model_validate(jsonio.loads(path.read_bytes(), str(path)))
            except (OSError, ValueError, ValidationError) as exc:
                raise RecordError(f"SR-IOV record {path} is unreadable: {exc}") from None
            out[record.pci_address] = record
        return out

    def put(self, record: PfRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        data = record.model_dump_json(by_alias=True).encode()
        write_atomic(self._path(record.pci_address), data, fsync=True)

    def remove(self, pci: str) -> None:
        self._path(pci).unlink(missing_ok=True)
