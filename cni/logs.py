"""Structured logs for every Plexus component: one JSON object per line.

All loggers live under `plexus` (plexus.cni, plexus.engine, plexus.deviceplugin, ...);
`configure` points that tree at a file and/or stderr.
"""

from __future__ import annotations

import json
import logging
import sys
import time
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
