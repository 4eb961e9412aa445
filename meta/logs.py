"""Structured logs: one JSON line per step, keyed by container ID and pod."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

LOGGER_NAME = "plexus"
_LEVELS = {
    "debug": logging.DEBUG,
    "verbose": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "panic": logging.CRITICAL,
}
_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    """Render a record and its `extra` fields as one JSON object."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: str = "info", log_file: str = "", to_stderr: bool = True) -> None:
    """Point the `plexus` loggers (ours and the protocol's) at a file and/or stderr."""
    handlers: list[logging.Handler] = []
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    formatter = JSONFormatter()
    for handler in handlers:
        handler.setFormatter(formatter)
    root = logging.getLogger(LOGGER_NAME)
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, logging.INFO))
    root.propagate = False


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
