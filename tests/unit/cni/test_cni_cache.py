from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path

import pytest

from cni.cache import CacheEntry, ResultCache
from cni.errors import CNIError, ErrorCode

CONFIG = b'{"cniVersion":"1.0.0","name":"net","type":"bridge"}'

# As libcni writes it (encoding/json: []byte as standard base64, omitempty fields absent).
LIBCNI_FILE = {
    "kind": "cniCacheV1",
    "containerId": "c1",
    "config": base64.b64encode(CONFIG).decode(),
    "ifName": "eth0",
    "networkName": "net",
    "netns": "/var/run/netns/cni-1",
    "cniArgs": [["IgnoreUnknown", "1"], ["K8S_POD_NAME", "p"]],
    "capabilityArgs": {"portMappings": [{"hostPort": 8080}]},
    "result": {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}], "dns": {}},
}


def entry(cid: str = "c1", net: str = "net", **kwargs: object) -> CacheEntry:
    return CacheEntry(container_id=cid, config=CONFIG, ifname="eth0", network_name=net, **kwargs)


def test_reads_and_writes_the_libcni_format(tmp_path: Path) -> None:
    parsed = CacheEntry.from_json(json.dumps(LIBCNI_FILE).encode())
    assert parsed.config == CONFIG
    assert parsed.cni_args == [("IgnoreUnknown", "1"), ("K8S_POD_NAME", "p")]
    assert json.loads(parsed.to_json()) == LIBCNI_FILE


def test_minimal_entry_omits_empty_fields() -> None:
    assert json.loads(entry().to_json()) == {
        "kind": "cniCacheV1",
        "containerId": "c1",
        "config": base64.b64encode(CONFIG).decode(),
        "ifName": "eth0",
        "networkName": "net",
    }


def test_save_load_delete(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path / "cni")
    saved = entry(netns="/proc/1/ns/net", result={"cniVersion": "1.0.0", "dns": {}})
    cache.save(saved)
    assert cache.path("net", "c1", "eth0") == tmp_path / "cni" / "results" / "net-c1-eth0"
    assert cache.load("net", "c1", "eth0") == saved
    assert os.listdir(tmp_path / "cni" / "results") == ["net-c1-eth0"]  # no temp files left
    cache.delete("net", "c1", "eth0")
    assert cache.load("net", "c1", "eth0") is None
    cache.delete("net", "c1", "eth0")


def test_corrupt_entry(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path)
    path = cache.path("net", "c1", "eth0")
    path.parent.mkdir()
    for content in (
        "{",
        json.dumps({**LIBCNI_FILE, "kind": "other"}),
        json.dumps({"kind": "cniCacheV1"}),
    ):
        path.write_text(content)
        with pytest.raises(CNIError) as exc:
            cache.load("net", "c1", "eth0")
        assert exc.value.code == ErrorCode.DECODE_FAILURE
        assert str(path) in exc.value.msg


def test_entries_skip_unreadable_files(tmp_path: Path) -> None:
    cache = ResultCache(tmp_path)
    assert cache.entries() == []
    cache.save(entry("c2"))
    cache.save(entry("c1"))
    cache.save(entry("c1", net="other"))
    results = tmp_path / "results"
    (results / "junk").write_text("not json")
    (results / "old-format").write_text(json.dumps({"cniVersion": "0.4.0", "ips": []}))
    (results / ".tmp-x").write_text(json.dumps(LIBCNI_FILE))
    (results / "blank").write_text(json.dumps({**LIBCNI_FILE, "ifName": ""}))
    (results / "dir").mkdir()
    assert [(e.network_name, e.container_id) for e in cache.entries()] == [
        ("net", "c1"),
        ("net", "c2"),
        ("other", "c1"),
    ]
    assert [e.container_id for e in cache.entries("net")] == ["c1", "c2"]


@pytest.mark.parametrize(
    ("net", "cid", "ifname"), [("a/b", "c", "i"), ("n", "", "i"), ("n", "c", "")]
)
def test_unsafe_names(tmp_path: Path, net: str, cid: str, ifname: str) -> None:
    with pytest.raises(CNIError) as exc:
        ResultCache(tmp_path).load(net, cid, ifname)
    assert exc.value.code == ErrorCode.INVALID_CONFIG


def test_bad_base64(tmp_path: Path) -> None:
    with pytest.raises(CNIError) as exc:
        CacheEntry.from_json(json.dumps({**LIBCNI_FILE, "config": "***"}).encode())
    assert "config" in exc.value.details


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record)


def test_scan_names_unreadable_files_and_entries_warn_once_each(
    tmp_path: Path, plexus_logger: logging.Logger
) -> None:
    cache = ResultCache(tmp_path)
    cache.save(entry("c1"))
    cache.save(entry("c2"))
    cut_short = cache.path("net", "c1", "net1")
    cut_short.write_text("")  # a crash before the data reached the disk
    found, unreadable = cache.scan(container_id="c1")
    assert [e.container_id for e in found] == ["c1"]
    assert list(unreadable) == [cut_short]
    assert unreadable[cut_short].code == ErrorCode.DECODE_FAILURE
    assert cache.scan(container_id="c2")[1] == {}  # only files that could be c2's are read

    handler = _Collect()
    plexus_logger.addHandler(handler)
    plexus_logger.setLevel(logging.INFO)
    assert [e.container_id for e in cache.entries("net")] == ["c1", "c2"]
    assert [(r.getMessage(), getattr(r, "file", "")) for r in handler.seen] == [
        ("ignoring unreadable CNI cache file", str(cut_short))
    ]

    cache.remove_unreadable("c1")
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "net-c1-eth0",
        "net-c2-eth0",
    ]


def test_a_name_too_long_for_a_file_is_refused_and_cannot_be_there(tmp_path: Path) -> None:
    """ADD checks the name before anything is attached (code 7, naming the network); DEL
    and CHECK find nothing under it (no ADD saved it) instead of failing on it."""
    cache = ResultCache(tmp_path)
    net = "n" * 240
    with pytest.raises(CNIError) as info:
        cache.path(net, "c" * 10, "eth0")
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert info.value.msg == (
        f"network name {net!r} is too long to name the result cache file of container "
        f"{'c' * 10} (256 bytes, more than the 255 a file name may have with the container "
        "ID and ifname)"
    )
    with pytest.raises(CNIError):
        cache.save(entry(net=net, cid="c" * 10))
    assert cache.load(net, "c" * 10, "eth0") is None
    cache.delete(net, "c" * 10, "eth0")
    assert cache.path("n" * 239, "c" * 10, "eth0").name == f"{'n' * 239}-{'c' * 10}-eth0"
