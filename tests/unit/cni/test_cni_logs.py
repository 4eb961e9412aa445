"""cni.logs: the JSON lines, where `configure` sends them, and nothing on stderr when off."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from cni import logs
from cni.config import load_network_config
from cni.errors import CNIError, ErrorCode
from cni.logs import LOGGER_NAME, StepLogger, call_fields
from cni.runtime import CNIRuntime, RuntimeConf
from tests.wait import wait_for


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_no_file_and_no_stderr_means_nothing_on_stderr(
    plexus_logger: logging.Logger, capfd: pytest.CaptureFixture[str]
) -> None:
    logs.configure("debug", "", to_stderr=False)
    log = logging.getLogger(f"{LOGGER_NAME}.engine")
    log.warning("a warning")
    log.error("an error")
    log.critical("a panic")
    StepLogger("cni", cid="c1").error("a step error", plugin="x")
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert [type(h) for h in plexus_logger.handlers] == [logging.NullHandler]


def test_before_configure_nothing_reaches_stderr_and_it_is_replayed(
    plexus_logger: logging.Logger, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # As a plugin runs: its config (which says where logs go) is read, and may warn,
    # before logging is configured.
    for handler in list(plexus_logger.handlers):
        plexus_logger.removeHandler(handler)
    plexus_logger.addHandler(logs._early)
    plexus_logger.propagate = False  # as after an earlier configure: no root handlers
    logging.getLogger(f"{LOGGER_NAME}.config").warning("unknown meta config key 'x' ignored")
    assert capfd.readouterr() == ("", "")

    log_file = tmp_path / "plexus.log"
    logs.configure("info", str(log_file), to_stderr=False)
    logging.getLogger(f"{LOGGER_NAME}.engine").info("after")
    assert [(line["logger"], line["msg"]) for line in _lines(log_file)] == [
        ("plexus.config", "unknown meta config key 'x' ignored"),
        ("plexus.engine", "after"),
    ]
    assert capfd.readouterr() == ("", "")
    assert not logs._early.records  # replayed once, not again on the next configure
    logs.configure("info", str(log_file), to_stderr=False)
    assert len(_lines(log_file)) == 2


def test_stderr_gets_json_lines_at_the_level(
    plexus_logger: logging.Logger, capfd: pytest.CaptureFixture[str]
) -> None:
    logs.configure("warning", "", to_stderr=True)
    logging.getLogger(f"{LOGGER_NAME}.engine").info("hidden")
    logging.getLogger(f"{LOGGER_NAME}.engine").warning("shown", extra={"cid": "c1"})
    _, err = capfd.readouterr()
    (line,) = [json.loads(text) for text in err.splitlines()]
    assert (line["level"], line["msg"], line["cid"]) == ("warning", "shown", "c1")


def test_plugin_call_lines_in_the_log_file(
    plexus_logger: logging.Logger,
    tmp_path: Path,
    bin_dir: Path,
    recorder: Any,
    capfd: pytest.CaptureFixture[str],
) -> None:
    log_file = tmp_path / "plexus.log"
    logs.configure("info", str(log_file), to_stderr=False)
    runtime = CNIRuntime([str(bin_dir)], tmp_path / "cache")
    args = (("K8S_POD_NAMESPACE", "apps"), ("K8S_POD_NAME", "web-0"))
    rt = RuntimeConf(container_id="f" * 64, netns="/run/netns/x", ifname="eth0", args=args)
    net = load_network_config(b'{"cniVersion": "1.0.0", "name": "n", "type": "recorder"}')
    runtime.add(net, rt)
    (line,) = _lines(log_file)
    assert {k: line[k] for k in ("logger", "msg", "cid", "pod", "plugin", "verb", "network")} == {
        "logger": "plexus.cni",
        "msg": "plugin add",
        "cid": "f" * 12,
        "pod": "apps/web-0",
        "plugin": "recorder",
        "verb": "add",
        "network": "n",
    }
    assert line["ms"] >= 0 and line["outcome"] == "ok"
    assert capfd.readouterr().err == ""


def test_step_logger_binds_fields(caplog: pytest.LogCaptureFixture) -> None:
    log = StepLogger("engine", verb="add", cid="c1").bind(pod="default/p")
    with caplog.at_level(logging.INFO, logger=f"{LOGGER_NAME}.engine"):
        with log.step("delegate add", network="n") as extra:
            extra["ips"] = ["10.0.0.2"]
        with pytest.raises(ValueError), log.step("delegate del"):
            raise ValueError("boom")
    ok, failed = (vars(r) for r in caplog.records)
    assert (ok["verb"], ok["cid"], ok["pod"], ok["network"]) == ("add", "c1", "default/p", "n")
    assert ok["ips"] == ["10.0.0.2"] and ok["outcome"] == "ok" and ok["ms"] >= 0
    assert (failed["outcome"], failed["error"], failed["levelname"]) == ("error", "boom", "ERROR")
    assert "code" not in failed


def test_step_logger_names_the_cni_error_code(caplog: pytest.LogCaptureFixture) -> None:
    log = StepLogger("engine", verb="add")
    with (
        caplog.at_level(logging.INFO, logger=f"{LOGGER_NAME}.engine"),
        pytest.raises(CNIError),
        log.step("cni add"),
    ):
        raise CNIError(ErrorCode.UNKNOWN_CONTAINER, "netns gone", "nothing attached")
    (failed,) = (vars(r) for r in caplog.records)
    assert (failed["code"], failed["error"]) == (3, "netns gone: nothing attached")


@pytest.mark.parametrize(
    ("container_id", "args", "expected"),
    [
        ("", {}, {}),
        ("abc", {}, {"cid": "abc"}),
        ("0123456789abcdef", {}, {"cid": "0123456789ab"}),
        ("c", {"K8S_POD_NAME": "p"}, {"cid": "c", "pod": "default/p"}),
        ("c", {"K8S_POD_NAMESPACE": "ns", "K8S_POD_NAME": "p"}, {"cid": "c", "pod": "ns/p"}),
        ("c", {"K8S_POD_NAMESPACE": "ns"}, {"cid": "c"}),
    ],
)
def test_call_fields(container_id: str, args: dict[str, str], expected: dict[str, str]) -> None:
    assert call_fields(container_id, args) == expected


def test_in_the_background_lines_are_formatted_and_written_off_the_callers_thread(
    plexus_logger: logging.Logger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    formatted_on: list[str] = []
    format_line = logs.JSONFormatter.format

    def recording(self: logs.JSONFormatter, record: logging.LogRecord) -> str:
        formatted_on.append(threading.current_thread().name)
        return format_line(self, record)

    monkeypatch.setattr(logs.JSONFormatter, "format", recording)
    log_file = tmp_path / "plexus.log"
    logs.configure("info", str(log_file), to_stderr=False, background=True)
    with pytest.raises(CNIError), StepLogger("engine", cid="c1").step("a step", n=1) as fields:
        fields["ips"] = ["10.0.0.2"]
        raise CNIError(ErrorCode.IO_FAILURE, "it broke")
    logging.getLogger(f"{LOGGER_NAME}.engine").info("after", extra={"cid": "c1"})
    logs.configure("info", str(log_file), to_stderr=False)  # writes out what is queued

    step, after = _lines(log_file)
    assert (step["msg"], step["cid"], step["n"], step["ips"], step["code"]) == (
        "a step",
        "c1",
        1,
        ["10.0.0.2"],
        ErrorCode.IO_FAILURE,
    )
    assert (after["msg"], after["cid"]) == ("after", "c1")
    assert threading.current_thread().name not in formatted_on and len(formatted_on) == 2


def test_in_the_background_a_calls_lines_wait_and_are_written_together(
    plexus_logger: logging.Logger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "WRITE_DELAY", 0.3)
    formatted_at: list[float] = []
    format_line = logs.JSONFormatter.format

    def recording(self: logs.JSONFormatter, record: logging.LogRecord) -> str:
        formatted_at.append(time.monotonic())
        return format_line(self, record)

    class Clock:
        """The time module, with the writing thread's sleeps noted."""

        sleeps: ClassVar[list[float]] = []

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            self.sleeps.append(seconds)
            time.sleep(seconds)

    monkeypatch.setattr(logs.JSONFormatter, "format", recording)
    monkeypatch.setattr(logs, "time", Clock())
    log_file = tmp_path / "plexus.log"
    logs.configure("info", str(log_file), to_stderr=False, background=True)
    log = StepLogger("engine", cid="c1")
    logged_at = time.monotonic()
    log.info("first")
    log.info("second")
    wait_for(lambda: len(_lines(log_file)) == 2, "both lines in the file")
    sleeps = list(Clock.sleeps)
    logs.configure("info", str(log_file), to_stderr=False)  # (its stop waits once more)

    assert formatted_at[0] - logged_at >= logs.WRITE_DELAY  # nothing before the delay
    assert sleeps == [logs.WRITE_DELAY]  # one delay for both lines
    assert [line["msg"] for line in _lines(log_file)] == ["first", "second"]
