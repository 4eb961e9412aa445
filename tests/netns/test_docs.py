"""The docs' commands that need root, run as written: `plexus inspect --config` on every
config the docs mention, and the `plexus cni` replay of docs/debugging.md."""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meta.daemon.cniconfig import ConfigWriter
from meta.daemon.config import DaemonConfig
from tests.docs import ROOT, blocks, commands, named_files
from tests.netns.conftest import sh

pytestmark = pytest.mark.netns

PLEXUS = Path(sys.executable).with_name("plexus")
UNSHARE = ("unshare", "--mount", "--propagation", "private", "--")


def _doc_configs() -> dict[str, str]:
    """Every plexus config the docs show or name, by where it comes from."""
    found = {b.where: b.text for b in blocks() if b.lang == "json" and '"type": "plexus"' in b.text}
    (shipped,) = [
        d
        for d in yaml.safe_load_all((ROOT / "crds" / "plexus-config.yaml").read_text())
        if d and d["kind"] == "ConfigMap"
    ]
    found["crds/plexus-config.yaml"] = shipped["data"]["daemon-config.json"]
    return found


def _generated_conflist(daemon_config: str, net_d: Path) -> str:
    """The 00-plexus.conflist the daemon writes from a config, next to a bridge primary."""
    net_d.mkdir()
    (net_d / "10-bridge.conf").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "cbr0", "type": "bridge"})
    )
    conf = DaemonConfig.model_validate_json(daemon_config)
    assert ConfigWriter(conf.model_copy(update={"cni_conf_dir": str(net_d)})).sync()
    return (net_d / conf.generated_name).read_text()


@pytest.mark.parametrize("origin", sorted(_doc_configs()))
def test_inspect_loads_every_config_the_docs_mention(origin: str, tmp_path: Path) -> None:
    text = _doc_configs()[origin]
    files = {"config.json": text}
    if origin.startswith("crds/"):
        files["00-plexus.conflist"] = _generated_conflist(text, tmp_path / "net.d")
    for name, content in files.items():
        path = tmp_path / name
        path.write_text(content)
        done = subprocess.run(
            [str(PLEXUS), "inspect", "--config", str(path)], capture_output=True, text=True
        )
        # 0 healthy, 1 problems on this node's state: both mean the config loaded.
        assert done.returncode in (0, 1), f"{origin} ({name}): {done.stderr}"
        assert done.stdout.startswith("attachments under "), done.stdout


def test_the_replay_of_debugging_md_runs_as_written(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "debugging.md"
    (block,) = [b for b in blocks([doc]) if b.mark == ("run", "tests/netns/test_docs.py")]
    for name, source in named_files(doc).items():
        (tmp_path / name).write_text(source.text)
    conf = json.loads((tmp_path / "10-replay.conf").read_text())
    lines = [
        shlex.join([str(PLEXUS), *words[1:]] if words[0] == "plexus" else words)
        for words in commands(block)
    ]
    # In a node namespace of its own (the bridge lives there) and a private mount
    # namespace whose /var/lib/cni is the test's: nothing of the host's is touched.
    state = tmp_path / "var-lib-cni"
    state.mkdir()
    script = f"mount --bind {state} /var/lib/cni\ncd {tmp_path}\n" + "\n".join(lines)
    node = f"pxt-docs-{tmp_path.name[-8:]}"
    pod = next(w.rsplit("/", 1)[1] for words in commands(block) for w in words if "/netns/" in w)
    sh("ip", "netns", "add", node)
    try:
        done = subprocess.run(
            [*UNSHARE, "ip", "netns", "exec", node, "sh", "-e", "-x", "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        subnet = ipaddress.ip_network(conf["ipam"]["subnet"])
        assert ipaddress.ip_interface(result["ips"][0]["address"]).ip in subnet
        for verb in ("ADD", "CHECK", "DEL"):
            assert f"{verb} of {conf['name']} for cnitool-" in done.stderr
        assert not any((state / "networks" / conf["name"]).glob("10.*"))  # released
    finally:
        sh("ip", "netns", "del", pod, check=False)
        sh("ip", "netns", "del", node, check=False)
