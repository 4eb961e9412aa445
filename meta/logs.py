"""Structured step logs of the engine: one JSON line per step, keyed by container ID and
pod, with its duration and outcome (the format and set-up are cni.logs)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from cni.logs import LOGGER_NAME


class StepLogger:
    """A logger bound to one CNI call's identity (verb, container, pod)."""

    def __init__(self, name: str, **fields: Any) -> None:
        self._logger = logging.getLogger(f"{LOGGER_NAME}.{name}")
        self.fields = fields

    def bind(self, **fields: Any) -> StepLogger:
        """A copy with more fields."""
        child = StepLogger.__new__(StepLogger)
        child._logger = self._logger
        child.fields = {**self.fields, **fields}
        return child

    def info(self, msg: str, **fields: Any) -> None:
        self._logger.info(msg, extra={**self.fields, **fields})

    def warning(self, msg: str, **fields: Any) -> None:
        self._logger.warning(msg, extra={**self.fields, **fields})

    def error(self, msg: str, **fields: Any) -> None:
        self._logger.error(msg, extra={**self.fields, **fields})

    @contextmanager
    def step(self, msg: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """Log `msg` once when the block ends, with its duration and outcome.

        The yielded dict lets the block add fields (for example the IPs it got).
        """
        extra: dict[str, Any] = dict(fields)
        start = time.perf_counter()
        try:
            yield extra
        except Exception as exc:
            self.error(msg, **extra, ms=_ms(start), outcome="error", error=str(exc))
            raise
        self.info(msg, **extra, ms=_ms(start), outcome="ok")


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 2)


def pod_fields(args: Mapping[str, str]) -> dict[str, str]:
    """The pod identity from CNI_ARGS, as log fields."""
    ns, name = args.get("K8S_POD_NAMESPACE", ""), args.get("K8S_POD_NAME", "")
    return {"pod": f"{ns}/{name}"} if name else {}
