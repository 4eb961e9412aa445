"""Structured logs for every Plexus component: one JSON object per line.

All loggers live under `plexus` (plexus.cni, plexus.engine, plexus.deviceplugin, ...);
`configure` points that tree at a file and/or stderr. A record's `extra` fields become
keys of its line; `StepLogger` binds a call's identity (`cid`, `pod`, `verb`) to every
line it writes and times steps (`ms`, `outcome`). The node daemon formats and writes
its lines on a thread of their own (`background`): a call's thread only queues them.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from cni.errors import CNIError

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


class _Early(logging.Handler):
    """Holds what the `plexus` tree logs before `configure` (a plugin reads its config,
    which says where logs go, before it can configure them): `configure` hands these
    records to the handlers it installs. Being a handler, it also keeps Python's
    last-resort handler from printing them to stderr."""

    def __init__(self, capacity: int = 100) -> None:
        super().__init__()
        self.records: deque[logging.LogRecord] = deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_early = _Early()
logging.getLogger(LOGGER_NAME).addHandler(_early)


class _Handoff(logging.handlers.QueueHandler):
    """Queues each record as it is: the listener's thread formats it (the stdlib's
    QueueHandler would format it here, on the caller's thread)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


WRITE_DELAY = 0.05
"""How long the background thread lets a call's first line wait before it formats it and
the lines logged after it: a call then answers without sharing the interpreter with the
formatting of its own lines."""


class _DelayedListener(logging.handlers.QueueListener):
    """Writes what is queued in batches: a record that arrives on an empty queue waits
    WRITE_DELAY, and everything queued meanwhile is written right after it."""

    def __init__(
        self, records: queue.SimpleQueue[logging.LogRecord], *handlers: logging.Handler
    ) -> None:
        super().__init__(records, *handlers)
        self._records = records

    def dequeue(self, block: bool) -> logging.LogRecord:
        try:
            return self._records.get_nowait()
        except queue.Empty:
            record = self._records.get(block)
            time.sleep(WRITE_DELAY)
            return record


_listener: logging.handlers.QueueListener | None = None


def _stop_listener() -> None:
    """Write out what is queued and end the writing thread (at exit, or on reconfigure)."""
    global _listener
    if _listener is not None:
        _listener.stop()
        for handler in _listener.handlers:
            handler.close()
        _listener = None


atexit.register(_stop_listener)


def configure(
    level: str = "info", log_file: str = "", to_stderr: bool = True, background: bool = False
) -> None:
    """Point the `plexus` loggers (ours and the protocol's) at a file and/or stderr.

    With neither, logs go nowhere (a NullHandler, so Python's last-resort handler does
    not print warnings to stderr). Records logged before the first call are replayed
    into the new handlers. With `background` (the daemon), a thread of their own formats
    and writes the lines: a JSON line costs ~0.1 ms, and a pod's ADD writes a dozen
    while its runtime waits.
    """
    global _listener
    _stop_listener()
    handlers: list[logging.Handler] = []
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    formatter = JSONFormatter()
    for handler in handlers:
        handler.setFormatter(formatter)
    if not handlers:
        handlers.append(logging.NullHandler())
    root = logging.getLogger(LOGGER_NAME)
    for old in list(root.handlers):
        root.removeHandler(old)
        if old is not _early:
            old.close()
    if background:
        records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        _listener = _DelayedListener(records, *handlers)
        _listener.start()
        root.addHandler(_Handoff(records))
    else:
        for handler in handlers:
            root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, logging.INFO))
    root.propagate = False
    early = list(_early.records)
    _early.records.clear()
    for record in early:
        if record.levelno >= root.level:
            for handler in handlers:
                handler.handle(record)


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
            if isinstance(exc, CNIError):
                extra["code"] = exc.code
            self.error(msg, **extra, ms=_ms(start), outcome="error", error=str(exc))
            raise
        self.info(msg, **extra, ms=_ms(start), outcome="ok")


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 2)


def call_fields(container_id: str, args: Mapping[str, str]) -> dict[str, str]:
    """A call's identity as log fields: `cid` (the container ID's first 12 characters, as
    runtimes print it) and `pod` (`namespace/name` from CNI_ARGS), each when known."""
    fields = {"cid": container_id[:12]} if container_id else {}
    name = args.get("K8S_POD_NAME", "")
    if name:
        fields["pod"] = f"{args.get('K8S_POD_NAMESPACE') or 'default'}/{name}"
    return fields
