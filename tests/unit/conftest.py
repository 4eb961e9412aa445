"""Fixtures for the unit tier: real reference plugins, small fake plugins (named as such)
and the `plexus` logger tree."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni import logs
from cni.logs import LOGGER_NAME

REFERENCE_DIR = "/usr/lib/cni"
HOST_LOCAL = os.path.join(REFERENCE_DIR, "host-local")

# A plugin that logs each call (its name, CNI_* env and stdin config) to a shared log,
# fails the verbs in `fail` with code 11 and passes prevResult through on ADD.
_RECORDER = """\
import json, os, sys
conf = json.loads(sys.stdin.read() or "{{}}")
env = {{k: v for k, v in os.environ.items() if k.startswith("CNI_")}}
with open({log!r}, "a") as f:
    f.write(json.dumps({{"plugin": {name!r}, "env": env, "conf": conf}}) + "\\n")
cmd = env.get("CNI_COMMAND")
if cmd in {fail!r}:
    print(json.dumps({{"code": 11, "msg": "recorder says no", "details": cmd}}))
    sys.exit(1)
if cmd == "VERSION":
    print(json.dumps({{"cniVersion": "1.1.0", "supportedVersions": ["1.0.0", "1.1.0"]}}))
elif cmd == "ADD":
    prev = conf.get("prevResult")
    print(json.dumps(prev or {{
        "cniVersion": conf["cniVersion"],
        "interfaces": [{{"name": env["CNI_IFNAME"], "sandbox": env["CNI_NETNS"]}}],
        "ips": [{{"address": "192.0.2.7/24", "interface": 0}}],
    }}))
"""


def write_plugin(directory: Path, name: str, body: str) -> Path:
    """Write an executable Python plugin script named `name` into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!{sys.executable} -I\n{body}")
    path.chmod(0o755)
    return path


@dataclass
class Recorder:
    """A fake plugin; `calls()` returns the calls of all recorders in `bin_dir`, in order."""

    bin_dir: Path
    name: str

    def calls(self) -> list[dict[str, Any]]:
        log = self.bin_dir / "calls.log"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]


def make_recorder(bin_dir: Path, name: str = "recorder", fail: tuple[str, ...] = ()) -> Recorder:
    log = str(bin_dir / "calls.log")
    write_plugin(bin_dir, name, _RECORDER.format(log=log, name=name, fail=list(fail)))
    return Recorder(bin_dir, name)


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A directory for fake plugins (put it in the runtime's paths)."""
    path = tmp_path / "bin"
    path.mkdir()
    return path


@pytest.fixture
def make_plugin(bin_dir: Path) -> Callable[[str, str], Path]:
    return lambda name, body: write_plugin(bin_dir, name, body)


@pytest.fixture
def make_recorder_plugin(bin_dir: Path) -> Callable[..., Recorder]:
    def make(name: str = "recorder", fail: tuple[str, ...] = ()) -> Recorder:
        return make_recorder(bin_dir, name, fail)

    return make


@pytest.fixture
def recorder(make_recorder_plugin: Callable[..., Recorder]) -> Recorder:
    return make_recorder_plugin()


@pytest.fixture
def host_local() -> str:
    if not os.access(HOST_LOCAL, os.X_OK):
        pytest.skip(f"reference plugin {HOST_LOCAL} is not installed")
    return REFERENCE_DIR


@pytest.fixture
def plexus_logger() -> Iterator[logging.Logger]:
    """The `plexus` logger tree, restored afterwards (configure changes it process-wide)."""
    root = logging.getLogger(LOGGER_NAME)
    handlers, level, propagate = list(root.handlers), root.level, root.propagate
    early = list(logs._early.records)  # what earlier tests logged: not this "process"
    logs._early.records.clear()
    yield root
    logs._early.records.clear()
    logs._early.records.extend(early)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if handler not in handlers:
            handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    root.propagate = propagate
