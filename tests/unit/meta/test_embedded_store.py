"""The embedded store: manifests in a directory as a cluster source."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.errors import CNIError, ErrorCode
from meta.sources.base import ClusterSource, NetworkAttachmentDefinition, Pod
from meta.sources.store import EVENTS_FILE, LOCK_FILE, EmbeddedStore
from meta.status import NETWORK_STATUS_ANNOTATION

NETWORKS = "k8s.v1.cni.cncf.io/networks"


def pod(name: str, namespace: str | None = "default", **annotations: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["annotations"] = {NETWORKS: "macvlan", **annotations}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "pause"}]},
    }


def nad(
    name: str, namespace: str = "default", config: Any = '{"type": "macvlan"}'
) -> dict[str, Any]:
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"config": config},
    }


def write(directory: Path, filename: str, body: Any) -> Path:
    path = directory / filename
    if filename.endswith(".json"):
        path.write_text(json.dumps(body))
    else:
        path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.fixture
def store(tmp_path: Path) -> EmbeddedStore:
    return EmbeddedStore(tmp_path)


def test_is_a_cluster_source(store: EmbeddedStore) -> None:
    source: ClusterSource = store
    assert source.get_pod("default", "nothing") is None


def test_finds_pods_in_yaml_and_json(tmp_path: Path, store: EmbeddedStore) -> None:
    write(tmp_path, "a.yaml", pod("a"))
    write(tmp_path, "b.json", pod("b", namespace="apps"))
    write(tmp_path, "c.yml", pod("c", namespace=None))
    assert store.get_pod("default", "a") == Pod(
        namespace="default",
        name="a",
        uid="uid-a",
        annotations={NETWORKS: "macvlan"},
        node_name="node-1",
    )
    b = store.get_pod("apps", "b")
    assert b is not None and b.uid == "uid-b" and not b.static
    c = store.get_pod("default", "c")  # no namespace: "default"
    assert c is not None and c.name == "c"
    assert store.get_pod("default", "b") is None
    assert store.get_pod("apps", "missing") is None


def test_finds_nads(tmp_path: Path, store: EmbeddedStore) -> None:
    write(tmp_path, "net.json", nad("macvlan", "apps"))
    body = nad("sriov")
    body["metadata"]["annotations"] = {"k8s.v1.cni.cncf.io/resourceName": "intel.com/sriov"}
    write(tmp_path, "sriov.yaml", body)
    bare = nad("bare")
    del bare["spec"]
    write(tmp_path, "bare.yaml", bare)
    write(tmp_path, "null.yaml", nad("null-config", config=None))

    assert store.get_nad("apps", "macvlan") == NetworkAttachmentDefinition(
        namespace="apps", name="macvlan", config='{"type": "macvlan"}'
    )
    sriov = store.get_nad("default", "sriov")
    assert sriov is not None and sriov.resource_name == "intel.com/sriov"
    assert store.get_nad("apps", "macvlan") is not None
    bare_nad = store.get_nad("default", "bare")
    assert bare_nad is not None and bare_nad.config == "" and bare_nad.resource_name is None
    null_nad = store.get_nad("default", "null-config")
    assert null_nad is not None and null_nad.config == ""
    assert store.get_nad("default", "macvlan") is None
    assert store.get_pod("apps", "macvlan") is None  # kinds do not mix


def test_static_pods(tmp_path: Path, store: EmbeddedStore) -> None:
    write(tmp_path, "api.yaml", pod("api", **{"kubernetes.io/config.source": "api"}))
    write(tmp_path, "file.yaml", pod("file", **{"kubernetes.io/config.source": "file"}))
    write(tmp_path, "mirror.yaml", pod("mirror", **{"kubernetes.io/config.mirror": "abc"}))
    static = {name: store.get_pod("default", name) for name in ("api", "file", "mirror")}
    assert {name: p.static for name, p in static.items() if p} == {
        "api": False,
        "file": True,
        "mirror": True,
    }


def test_lookups_see_changes(tmp_path: Path, store: EmbeddedStore) -> None:
    assert store.get_nad("default", "n") is None
    path = write(tmp_path, "n.yaml", nad("n", config="one"))
    assert (found := store.get_nad("default", "n")) and found.config == "one"
    write(tmp_path, "n.yaml", nad("n", config="two"))
    assert (found := store.get_nad("default", "n")) and found.config == "two"
    path.unlink()
    assert store.get_nad("default", "n") is None


def test_first_file_wins(tmp_path: Path, store: EmbeddedStore) -> None:
    write(tmp_path, "b.yaml", nad("n", config="from-b"))
    write(tmp_path, "a.json", nad("n", config="from-a"))
    assert (found := store.get_nad("default", "n")) and found.config == "from-a"


def test_unparsable_files_and_other_kinds_are_skipped(
    tmp_path: Path, store: EmbeddedStore, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "broken.yaml").write_text("kind: [unclosed\n")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "two.yaml").write_text(
        yaml.safe_dump(pod("x")) + "---\n" + yaml.safe_dump(pod("y"))
    )
    write(tmp_path, "svc.yaml", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}})
    write(tmp_path, "v2.yaml", {**nad("n"), "apiVersion": "k8s.cni.cncf.io/v2"})
    write(tmp_path, "anon.yaml", {**nad("n"), "metadata": {"namespace": "default"}})
    (tmp_path / "notes.txt").write_text("ignored")
    write(tmp_path, "good.yaml", nad("good"))

    with caplog.at_level(logging.WARNING, logger="plexus.store"):
        assert store.get_nad("default", "good") is not None
        assert store.get_nad("default", "n") is None
        assert store.get_pod("default", "x") is None
    warned = {record.getMessage().split(":")[0] for record in caplog.records}
    expected = ["broken.yaml", "broken.json", "list.yaml", "binary.yaml", "two.yaml", "svc.yaml"]
    expected += ["v2.yaml", "anon.yaml"]
    assert warned == {str(tmp_path / name) for name in expected}
    assert all(record.name == "plexus.store" for record in caplog.records)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (nad("bad", config={"type": "macvlan"}), "spec.config: Input should be a valid string"),
        ({**nad("bad"), "spec": "x"}, "spec: Input should be a map"),
        (
            {**nad("bad"), "metadata": {"name": "bad", "annotations": {"a": 1}}},
            "metadata.annotations.a: Input should be a valid string",
        ),
    ],
)
def test_malformed_nad_is_an_error_when_asked_for(
    tmp_path: Path, store: EmbeddedStore, body: dict[str, Any], message: str
) -> None:
    path = write(tmp_path, "bad.yaml", body)
    write(tmp_path, "good.yaml", nad("good"))
    assert store.get_nad("default", "good") is not None
    with pytest.raises(CNIError) as caught:
        store.get_nad("default", "bad")
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert caught.value.msg == f"{path}: NetworkAttachmentDefinition bad: {message}"


def test_malformed_pod_is_an_error_when_asked_for(tmp_path: Path, store: EmbeddedStore) -> None:
    body = pod("p")
    body["metadata"]["uid"] = 42
    write(tmp_path, "p.yaml", body)
    with pytest.raises(CNIError, match=r"p\.yaml: Pod p: metadata\.uid: Input should be"):
        store.get_pod("default", "p")


def test_missing_directory_is_an_io_failure(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "nope")
    with pytest.raises(CNIError) as caught:
        store.get_pod("default", "p")
    assert caught.value.code == ErrorCode.IO_FAILURE
    assert str(tmp_path / "nope") in caught.value.msg


# ---- network-status -----------------------------------------------------------------

STATUS = '[{\n    "name": "cbr0",\n    "default": true,\n    "dns": {}\n}]'


def test_status_write_keeps_yaml_and_other_fields(tmp_path: Path, store: EmbeddedStore) -> None:
    path = write(tmp_path, "p.yaml", pod("p"))
    os.chmod(path, 0o640)
    found = store.get_pod("default", "p")
    assert found is not None
    store.set_network_status(found, STATUS)

    body = yaml.safe_load(path.read_text())
    expected = pod("p")
    expected["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] = STATUS
    assert body == expected
    assert list(body) == ["apiVersion", "kind", "metadata", "spec"]
    assert list(body["metadata"]) == ["name", "uid", "namespace", "annotations"]
    assert "network-status: |-\n" in path.read_text()  # readable block, not an escaped line
    assert path.stat().st_mode & 0o777 == 0o640
    again = store.get_pod("default", "p")
    assert again is not None and again.annotations[NETWORK_STATUS_ANNOTATION] == STATUS

    store.set_network_status(found, "[]")  # overwrites
    assert yaml.safe_load(path.read_text())["metadata"]["annotations"] == {
        NETWORKS: "macvlan",
        NETWORK_STATUS_ANNOTATION: "[]",
    }


def test_status_write_keeps_json(tmp_path: Path, store: EmbeddedStore) -> None:
    body = pod("p", namespace="apps")
    del body["metadata"]["annotations"]
    body["status"] = {"phase": "Pending"}
    path = write(tmp_path, "p.json", body)
    store.set_network_status(Pod(namespace="apps", name="p"), STATUS)
    text = path.read_text()
    body["metadata"]["annotations"] = {NETWORK_STATUS_ANNOTATION: STATUS}
    assert text == json.dumps(body, indent=2) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".plexus-store.lock", "p.json"]


def test_yml_files_are_found_and_written_back_as_yaml(tmp_path: Path, store: EmbeddedStore) -> None:
    path = write(tmp_path, "p.yml", pod("p", namespace="apps"))
    found = store.get_pod("apps", "p")
    assert found is not None and found.uid == "uid-p"
    assert [p.name for p in store.pods()] == ["p"]
    store.set_network_status(found, STATUS)

    text = path.read_text()
    assert not text.lstrip().startswith("{")  # not rewritten as JSON
    assert "network-status: |-\n" in text
    expected = pod("p", namespace="apps")
    expected["metadata"]["annotations"][NETWORK_STATUS_ANNOTATION] = STATUS
    assert yaml.safe_load(text) == expected
    assert list(yaml.safe_load(text)) == ["apiVersion", "kind", "metadata", "spec"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".plexus-store.lock", "p.yml"]
    again = store.get_pod("apps", "p")
    assert again is not None and again.annotations[NETWORK_STATUS_ANNOTATION] == STATUS


def test_status_for_a_gone_pod_is_not_an_error(
    store: EmbeddedStore, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="plexus.store"):
        store.set_network_status(Pod(namespace="default", name="gone"), STATUS)
    assert "pod default/gone is gone" in caplog.text


def test_status_write_failure_is_an_io_failure(
    tmp_path: Path, store: EmbeddedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "p.yaml", pod("p"))
    before = path.read_text()

    def fail(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(CNIError) as caught:
        store.set_network_status(Pod(namespace="default", name="p"), STATUS)
    assert caught.value.code == ErrorCode.IO_FAILURE
    assert caught.value.msg == f"cannot write {path}: [Errno 28] No space left on device"
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".plexus-store.lock", "p.yaml"]


def test_concurrent_status_writers_all_land(tmp_path: Path, store: EmbeddedStore) -> None:
    names = [f"p{i}" for i in range(12)]
    for i, name in enumerate(names):
        write(tmp_path, f"{name}.{'json' if i % 2 else 'yaml'}", pod(name))
    barrier = threading.Barrier(len(names) * 2)
    errors: list[BaseException] = []

    def writer(name: str, value: str) -> None:
        try:
            barrier.wait()
            for round_ in range(5):
                EmbeddedStore(tmp_path).set_network_status(
                    Pod(namespace="default", name=name), f"{value}-{round_}"
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(name, name)) for name in names]
    threads += [threading.Thread(target=writer, args=("p0", f"other{i}")) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    for name in names[1:]:
        found = store.get_pod("default", name)
        assert found is not None
        assert found.annotations[NETWORK_STATUS_ANNOTATION] == f"{name}-4"
        assert found.annotations[NETWORKS] == "macvlan"
    p0 = store.get_pod("default", "p0")
    assert p0 is not None and p0.annotations[NETWORK_STATUS_ANNOTATION].endswith("-4")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# ---- events -------------------------------------------------------------------------


def test_events_are_appended_as_json_lines(tmp_path: Path, store: EmbeddedStore) -> None:
    p = Pod(namespace="apps", name="p")
    store.record_event(p, "Normal", "AddedInterface", "Add net1 [10.1.1.2/24] from apps/macvlan")
    store.record_event(p, "Warning", "NoNetworkFound", 'no "x"\nsecond line')
    lines = (tmp_path / EVENTS_FILE).read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert [{k: v for k, v in e.items() if k != "time"} for e in events] == [
        {
            "namespace": "apps",
            "pod": "p",
            "type": "Normal",
            "reason": "AddedInterface",
            "message": "Add net1 [10.1.1.2/24] from apps/macvlan",
        },
        {
            "namespace": "apps",
            "pod": "p",
            "type": "Warning",
            "reason": "NoNetworkFound",
            "message": 'no "x"\nsecond line',
        },
    ]
    assert all(e["time"].endswith("Z") and e["time"][:2] == "20" for e in events)
    assert list(events[0]) == ["time", "namespace", "pod", "type", "reason", "message"]


def test_concurrent_events_all_land(tmp_path: Path) -> None:
    def emit(i: int) -> None:
        for j in range(20):
            EmbeddedStore(tmp_path).record_event(
                Pod(namespace="default", name=f"p{i}"), "Normal", "R", f"{i}-{j}" + "x" * 2000
            )

    threads = [threading.Thread(target=emit, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = (tmp_path / EVENTS_FILE).read_text().splitlines()
    messages = sorted(json.loads(line)["message"][:5].rstrip("x") for line in lines)
    assert messages == sorted(f"{i}-{j}" for i in range(8) for j in range(20))


def test_event_write_failure_is_logged_not_raised(tmp_path: Path) -> None:
    """Events are best effort for every source: a failed append never fails the call."""
    store = EmbeddedStore(tmp_path / "nope")
    store.record_event(Pod(namespace="d", name="p"), "Normal", "R", "m")
    assert not (tmp_path / "nope").exists()


def test_store_files_are_not_objects(
    tmp_path: Path, store: EmbeddedStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Its events file and lock file are not read as manifests (nor warned about)."""
    write(tmp_path, "p.yaml", pod("p"))
    store.record_event(Pod(namespace="default", name="p"), "Normal", "R", "m")
    store.set_network_status(Pod(namespace="default", name="p"), STATUS)
    assert {p.name for p in tmp_path.iterdir()} >= {"p.yaml", EVENTS_FILE, LOCK_FILE}
    with caplog.at_level(logging.WARNING, logger="plexus.store"):
        assert [p.name for p in store.pods()] == ["p"]
    assert caplog.records == []
