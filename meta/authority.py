"""The daemon's own config decides: a call over the socket brings only what a runtime does.

A runtime sends the conflist it read from the admin's net.d, but anything that can reach
the daemon's socket (a delegate exec'd by a tenant's NAD, say) could send any stdin. So
every key except those a runtime supplies comes from the config the daemon loaded; a
call whose stdin sets one to another value is refused: that is a stale conflist or an
attack, and either way the daemon must not act on it.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from cni import jsonio
from cni.errors import CNIError, ErrorCode
from cni.models import validation_details
from meta.config import MetaConfig

log = logging.getLogger("plexus.daemon")

RUNTIME_KEYS = frozenset(
    {
        "cniVersion",
        "name",
        "type",
        "runtimeConfig",
        "prevResult",
        "capabilities",
        "args",
        "cni.dev/valid-attachments",
        "cni.dev/attachments",
    }
)
"""What a runtime puts into a call's config (the CNI spec and libcni); the rest is the
admin's, which the daemon already has."""
_SHOWN = 120  # characters of a refused value quoted in the error


def call_config(authority: MetaConfig, stdin: bytes) -> MetaConfig:
    """`authority` with the runtime's keys taken from the call's stdin; CNIError(INVALID_CONFIG)
    naming every other key the stdin sets to something else."""
    raw = jsonio.loads(stdin, "the call's config")
    if not isinstance(raw, dict):
        raise CNIError(ErrorCode.DECODE_FAILURE, "the call's config must be a JSON object")
    try:
        call = type(authority).model_validate(raw)
    except ValidationError as exc:
        raise CNIError(
            ErrorCode.INVALID_CONFIG, "invalid plexus config", validation_details(exc)
        ) from exc
    differing = _differing(authority, call)
    if differing:
        shown = "; ".join(f"{key}={_quote(raw[key])}" for key in differing)
        log.warning(
            "refused a call whose config overrides the daemon's: a stale CNI config, or an "
            "attempt to run Plexus with settings the admin did not give it",
            extra={"keys": differing},
        )
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"the call's config sets {', '.join(differing)} differently from the daemon's "
            "own config, which alone decides them",
            f"{shown}; a runtime's config must be the one the daemon generated or match "
            "its config file (regenerate it, or fix the daemon's config)",
        )
    runtime = {
        name: getattr(call, name)
        for name, field in MetaConfig.model_fields.items()
        if (field.alias or name) in RUNTIME_KEYS
    }
    extra = {key: value for key, value in (call.model_extra or {}).items() if key in RUNTIME_KEYS}
    merged = authority.model_copy(update=runtime)
    if extra:
        merged.__pydantic_extra__ = {**(authority.model_extra or {}), **extra}
    return merged


def _differing(authority: MetaConfig, call: MetaConfig) -> list[str]:
    """Aliases of the keys the call sets, outside RUNTIME_KEYS, whose value is not the
    daemon's (keys Plexus does not know are ignored, as everywhere: nothing reads them)."""
    fields = type(authority).model_fields
    differing = []
    for name in call.model_fields_set & fields.keys():
        alias = fields[name].alias or name
        if alias not in RUNTIME_KEYS and getattr(call, name) != getattr(authority, name):
            differing.append(alias)
    return sorted(differing)


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
