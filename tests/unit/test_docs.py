"""The README and docs/ are true to the code: config tables against the pydantic models,
every JSON and YAML example parsed and loaded as Plexus loads it, every command checked
against what it names (Makefile targets, the CLI's arguments, the manifests, the
benchmarks `make bench` runs), every relative link resolving. tests/netns/test_docs.py
runs what needs root: `plexus inspect` on each config, the `plexus cni` replay."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from cni.config import load_network_config
from deviceplugin.allocate import container_response
from deviceplugin.cli import list_pools
from deviceplugin.config import load_config, parse_config
from deviceplugin.provision.crs import NodePolicy, PoolConfig, SriovNetwork
from deviceplugin.sysfs import discover
from meta.cli import _parser, load_node_config
from meta.config import MetaConfig
from meta.daemon.config import DaemonConfig
from meta.selection import parse_networks
from tests.docs import DOCS, ROOT, Block, blocks, commands, named_files, table
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

CONFIGURATION = ROOT / "docs" / "configuration.md"
MAKEFILE = (ROOT / "Makefile").read_text()
CRDS: list[dict[str, Any]] = [
    d
    for f in sorted((ROOT / "crds").rglob("*.yaml"))
    for d in yaml.safe_load_all(f.read_text())
    if d and "metadata" in d  # Kubernetes objects (not kustomization files)
]


def _block_id(block: Block) -> str:
    return block.where


def _of(lang: str) -> list[Block]:
    return [b for b in blocks() if b.lang == lang]


# ---- configuration.md against the models ------------------------------------------


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    """Alias -> "required", or the default as plain JSON data."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.is_required():
            out[field.alias or name] = "required"
        else:
            default = field.get_default(call_default_factory=True)
            out[field.alias or name] = (
                default.model_dump() if isinstance(default, BaseModel) else default
            )
    return out


def _documented_default(cell: str) -> Any:
    if cell == "required":
        return cell
    assert cell.startswith("`") and cell.endswith("`"), f"default {cell!r} is not `JSON`"
    return json.loads(cell.strip("`"))


META = _fields(MetaConfig)
DAEMON = {k: v for k, v in _fields(DaemonConfig).items() if k not in META or META[k] != v}
"""Keys of the daemon's file that are not meta config keys, or whose default differs."""


@pytest.mark.parametrize(
    ("heading", "expected"),
    [("The meta config", META), ("Daemon-only keys", DAEMON)],
    ids=["meta", "daemon"],
)
def test_configuration_tables_document_every_key_with_its_default(
    heading: str, expected: dict[str, Any]
) -> None:
    rows = table(CONFIGURATION, heading)
    missing = sorted(expected.keys() - rows.keys())
    assert not missing, f"docs/configuration.md, {heading!r}: add a row for {missing}"
    unknown = sorted(rows.keys() - expected.keys())
    assert not unknown, f"docs/configuration.md, {heading!r}: no such key {unknown}"
    for key, row in rows.items():
        assert len(row) == 4, f"{key}: a row is | key | type | default | meaning |"
        assert _documented_default(row[2]) == expected[key], f"{key}: default is {expected[key]!r}"
        assert row[3], f"{key}: say what it means"


# ---- JSON and YAML examples -----------------------------------------------------


def _check_json(block: Block, tmp_path: Path) -> None:
    data = json.loads(block.text)
    assert isinstance(data, dict), "a JSON example is one object"
    plugins = data.get("plugins", [data])
    if data.get("type") == "pci":  # a device-info file
        assert data["version"] and data["pci"]["pci-address"]
    elif "resourceList" in data:
        parse_config(block.text)
    elif any(p.get("type") in ("plexus", "plexus-thin") for p in plugins):
        path = tmp_path / "config.json"
        path.write_text(block.text)
        load_node_config(str(path))
    else:
        load_network_config(block.text.encode())


@pytest.mark.parametrize("block", _of("json"), ids=_block_id)
def test_json_examples_load_as_plexus_loads_them(block: Block, tmp_path: Path) -> None:
    _check_json(block, tmp_path)


def _crd(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in CRDS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert found, f"no {kind} {name} in crds/"
    return found[0]


def _check_kustomization(doc: dict[str, Any]) -> None:
    for resource in doc["resources"]:
        base = resource.rstrip("/").split("/crds", 1)[-1]  # ../plexus/crds[/uninstall]
        assert (ROOT / f"crds{base}" / "kustomization.yaml").is_file(), f"{resource}: no base"
    images = {c["image"].split(":")[0] for d in CRDS for c in _containers(d)}
    for image in doc.get("images", []):
        assert image["name"] in images, f"no image {image['name']} in crds/"
    for patch in doc.get("patches", []):
        target = yaml.safe_load(patch["patch"])
        shipped = _crd(target["kind"], target["metadata"]["name"])
        volumes = {v["name"] for v in shipped["spec"]["template"]["spec"]["volumes"]}
        for volume in target["spec"]["template"]["spec"].get("volumes", []):
            assert volume["name"] in volumes, f"{volume['name']}: no such volume"


def _check_yaml(doc: dict[str, Any]) -> None:
    kind = doc["kind"]
    if kind == "NetworkAttachmentDefinition":
        config = json.loads(doc["spec"]["config"])
        config.setdefault("name", doc["metadata"]["name"])  # injected, as Plexus does
        load_network_config(json.dumps(config).encode())
    elif kind == "Pod":
        annotation = doc["metadata"].get("annotations", {}).get("k8s.v1.cni.cncf.io/networks")
        if annotation is not None:
            assert parse_networks(annotation, doc["metadata"]["namespace"])
    elif kind == "Kustomization":
        _check_kustomization(doc)
    elif kind == "ConfigMap" and "daemon-config.json" in doc["data"]:
        DaemonConfig.model_validate_json(doc["data"]["daemon-config.json"])
    elif kind in _SRIOV_KINDS:
        _SRIOV_KINDS[kind](doc)
    else:
        assert kind in ("DeviceClass", "ResourceClaimTemplate") or _shipped_crd(doc), (
            f"{doc['apiVersion']} {kind}: neither built in nor a CRD of crds/"
        )


_SRIOV_KINDS: dict[str, Callable[[dict[str, Any]], object]] = {
    "SriovNetworkNodePolicy": NodePolicy.from_api,
    "SriovNetworkPoolConfig": PoolConfig.from_api,
    "SriovNetwork": SriovNetwork.from_api,
}
"""The sriov-network-operator's kinds Plexus reads, parsed as the provisioning agent does."""


def _shipped_crd(doc: dict[str, Any]) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    return any(
        d["kind"] == "CustomResourceDefinition"
        and d["spec"]["group"] == group
        and d["spec"]["names"]["kind"] == doc["kind"]
        and version in {v["name"] for v in d["spec"]["versions"]}
        for d in CRDS
    )


@pytest.mark.parametrize("block", _of("yaml"), ids=_block_id)
def test_yaml_examples_parse_and_load(block: Block) -> None:
    docs = [d for d in yaml.safe_load_all(block.text) if d]
    assert docs
    for doc in docs:
        _check_yaml(doc)


# ---- commands -------------------------------------------------------------------


def _targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", MAKEFILE, re.MULTILINE))


def _bench_lines() -> set[str]:
    recipe = MAKEFILE.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    return {
        line.strip().replace("$(PY)", ".venv/bin/python3")
        for line in recipe.splitlines()[1:]
        if line.startswith("\t")
    }


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    if doc["kind"] != "DaemonSet":
        return []
    spec = doc["spec"]["template"]["spec"]
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _check_plexus(words: list[str], block: Block) -> None:
    try:
        args = _parser().parse_args(words[1:])
    except SystemExit as exc:
        raise AssertionError(f"plexus refuses {' '.join(words[1:])!r}") from exc
    conf = getattr(args, "conf", None)
    if conf is not None and "/" not in conf:  # a file the doc itself shows
        assert conf in named_files(block.path), f"{conf}: no <!-- file: {conf} --> block"


def _check_kubectl(words: list[str], block: Block) -> None:
    if "--" in words:  # kubectl exec ... -- COMMAND
        split = words.index("--")
        words, inner = words[:split], words[split + 1 :]
        assert inner[0] == "plexus", f"exec of {inner[0]}"
        _check_plexus(inner, block)
        daemon = _crd("DaemonSet", "plexus")["spec"]["template"]["spec"]["containers"][0]
        if "--config" in inner:  # the file the daemon itself reads
            config = inner[inner.index("--config") + 1]
            assert config == daemon["command"][daemon["command"].index("--config") + 1]
    verb = next(
        w for i, w in enumerate(words[1:], 1) if not w.startswith("-") and words[i - 1] != "-n"
    )
    assert verb in ("apply", "delete", "get", "logs", "exec", "rollout"), verb
    for flag, value in itertools.pairwise(words):
        if flag == "-f":
            assert (ROOT / value).is_file(), f"{value}: no such file"
        elif flag == "-k":
            overlays = [b for b in blocks([block.path]) if f"# {value}kustomization.yaml" in b.text]
            assert overlays, f"{value}: the doc shows no {value}kustomization.yaml"
        elif flag == "-n":
            assert value == "kube-system"
        elif flag == "-c":
            names = {c["name"] for d in CRDS for c in _containers(d)}
            assert value in names, f"no container {value} in crds/"
    for word in words:
        if word.startswith("ds/"):
            _crd("DaemonSet", word[3:])
    if "get" in words and words[words.index("get") + 1] == "ds":
        _crd("DaemonSet", words[words.index("get") + 2])


def _check_command(words: list[str], block: Block) -> None:
    program = words[0]
    checks: dict[str, Callable[[], None]] = {
        "make": lambda: _check_make(words),
        "plexus": lambda: _check_plexus(words, block),
        "kubectl": lambda: _check_kubectl(words, block),
        ".venv/bin/python3": lambda: _check_bench(words),
        "docker": lambda: _check_docker(words),
        "ip": lambda: _check_ip(words),
    }
    assert program in checks, f"{block.where}: no check for {program!r} commands"
    checks[program]()


def _check_make(words: list[str]) -> None:
    assert len(words) == 2 and words[1] in _targets(), f"no Makefile target {words[1:]}"


def _check_bench(words: list[str]) -> None:
    command = " ".join(words)
    assert command in _bench_lines(), f"{command!r} is not a line of the Makefile's bench target"


def _check_docker(words: list[str]) -> None:
    if words[1] == "build":
        assert (ROOT / words[words.index("-f") + 1]).is_file() and words[-1] == "."
    else:
        assert words[1] == "push"


def _check_ip(words: list[str]) -> None:
    assert words[1:3] in (["netns", "add"], ["netns", "del"]) and len(words) == 4


@pytest.mark.parametrize("block", _of("sh"), ids=_block_id)
def test_every_command_names_what_exists(block: Block) -> None:
    found = commands(block)
    assert found
    for words in found:
        _check_command(words, block)


def test_readme_quick_start_is_the_two_commands() -> None:
    (quick,) = [b for b in blocks([ROOT / "README.md"]) if b.heading == "Quick start"]
    assert commands(quick) == [["make", "demo"], ["make", "test"]]
    assert {"demo", "test"} <= _targets()


def test_every_benchmark_of_make_bench_has_its_results() -> None:
    documented = {
        " ".join(words)
        for b in blocks([ROOT / "docs" / "performance.md"])
        if b.lang == "sh"
        for words in commands(b)
    }
    missing = sorted(_bench_lines() - documented)
    assert not missing, f"docs/performance.md: add a section with the results of {missing}"
    extra = sorted(documented - _bench_lines())
    assert not extra, f"docs/performance.md: {extra} is not what make bench runs"


# ---- links ----------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
_PATH = re.compile(
    r"(?<![\w/.-])((?:docs|crds|tests|scripts|meta|cni|kube|delegates|deviceplugin)/[\w./-]+\w)"
)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_repository_paths_resolve(path: Path) -> None:
    text = path.read_text()
    for target, _ in _LINK.findall(text):
        if not target.startswith("http"):
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"
    for name in _PATH.findall(text):
        if "<" in name or name.startswith("docs/security"):
            continue
        assert (ROOT / name).exists() or (ROOT / name.split(":")[0]).exists(), (
            f"{path.name}: {name} does not exist"
        )


# ---- output quoted in docs/sriov.md -----------------------------------------------


def _sriov_host(root: Path) -> Path:
    """The fake SR-IOV host docs/sriov.md's output comes from: one PF, two VFs on iavf and
    one on vfio-pci (a FAKE sysfs tree: this machine has no SR-IOV)."""
    tree = FakeSysfs(root)
    tree.add_pf("0000:3b:00.0", "ens1f0")
    tree.add_vf("0000:3b:00.0", 0, "0000:3b:02.0", netdev="ens1f0v0")
    tree.add_vf("0000:3b:00.0", 1, "0000:3b:02.1", netdev="ens1f0v1")
    tree.add_vf("0000:3b:00.0", 2, "0000:3b:02.2", driver="vfio-pci", iommu_group=42)
    return root


def test_sriov_md_quotes_what_the_device_plugin_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = blocks([ROOT / "docs" / "sriov.md"])
    config = tmp_path / "config.json"
    config.write_text(_crd("ConfigMap", "plexus-deviceplugin-config")["data"]["config.json"])
    sysfs = _sriov_host(tmp_path / "sys")

    assert list_pools(str(config), str(sysfs)) == 0
    listing = next(i for i, b in enumerate(doc) if "deviceplugin list" in b.text)
    assert json.loads(capsys.readouterr().out) == json.loads(doc[listing + 1].text)

    (env_block,) = [b for b in doc if b.lang == "text" and b.text.startswith("PCIDEVICE_")]
    documented = dict(line.split("=", 1) for line in env_block.text.splitlines())
    resource = load_config(config).resource_list[0]
    pool = {d.address: d for d in discover(sysfs) if d.driver == "iavf"}
    response = container_response(
        resource, ["0000:3b:02.0"], pool, sysfs_root=sysfs, devinfo_dir=str(tmp_path)
    )
    assert dict(response.envs) == documented
    (info_block,) = [b for b in doc if b.lang == "json" and '"pci"' in b.text]
    (written,) = (tmp_path / "dp").iterdir()
    assert json.loads(written.read_text()) == json.loads(info_block.text)
