"""The generated 00-plexus.conflist across daemon restarts (meta.daemon.cniconfig)."""

from __future__ import annotations

import json
from pathlib import Path

from meta.daemon.cniconfig import ConfigWriter
from meta.daemon.config import DaemonConfig


def _writer(net_d: Path) -> ConfigWriter:
    conf = DaemonConfig.model_validate(
        {"cniVersion": "1.0.0", "name": "p", "type": "plexus", "cniConfigDir": str(net_d)}
    )
    return ConfigWriter(conf, interval=3600)


def test_a_restarted_daemon_keeps_the_file_and_leaves_it_alone(tmp_path: Path) -> None:
    (tmp_path / "10-primary.conf").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "primary", "type": "bridge"})
    )
    first = _writer(tmp_path)
    assert first.sync()
    generated = tmp_path / "00-plexus.conflist"
    inode = generated.stat().st_ino
    first.start()
    first.stop()  # the daemon's shutdown
    assert generated.stat().st_ino == inode  # still there: pods keep coming to the shim

    assert _writer(tmp_path).sync()  # the next daemon: same content, no rewrite
    assert generated.stat().st_ino == inode
