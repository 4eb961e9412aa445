"""Shared pydantic plumbing for the wire models."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class WireModel(BaseModel):
    """Base for JSON wire objects: camelCase aliases or field names, unknown keys ignored."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")


def validation_details(err: ValidationError) -> str:
    """A one-line summary of a pydantic error, e.g. "ips.0.address: value is not ..."."""
    parts = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"]) or "<root>"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)
