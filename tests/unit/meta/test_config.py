"""The meta config: Multus keys, defaults and clear errors."""

from __future__ import annotations

import json

import pytest

from cni.errors import CNIError, ErrorCode
from meta.config import load_meta_config


def _conf(**extra: object) -> bytes:
    base: dict[str, object] = {
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus",
        "delegates": [{"type": "bridge", "name": "b"}],
    }
    base.update(extra)
    return json.dumps(base).encode()


def test_multus_keys_and_defaults() -> None:
    conf = load_meta_config(
        _conf(
            globalNamespaces="default, infra",
            namespaceIsolation=True,
            readinessindicatorfile="/run/ready",
            multusNamespace="plx",
        )
    )
    assert conf.global_namespaces == ["default", "infra"]
    assert conf.system_namespaces == ["kube-system"]
    assert conf.readiness_indicator_file == "/run/ready"
    assert conf.multus_namespace == "plx"
    assert conf.cni_dir == "/var/lib/cni/plexus"
    assert conf.namespace_allowed("apps", "infra") and not conf.namespace_allowed("apps", "other")


def test_isolation_off_allows_any_namespace() -> None:
    assert load_meta_config(_conf()).namespace_allowed("apps", "other")


def test_unknown_keys_are_kept_for_gc() -> None:
    conf = load_meta_config(_conf(**{"cni.dev/valid-attachments": []}))
    assert conf.model_extra == {"cni.dev/valid-attachments": []}


@pytest.mark.parametrize(
    ("data", "code", "words"),
    [
        (b"{nope", ErrorCode.DECODE_FAILURE, "cannot decode"),
        (b"[]", ErrorCode.DECODE_FAILURE, "JSON object"),
        (_conf(delegates=[]), ErrorCode.INVALID_CONFIG, "clusterNetwork"),
        (_conf(logLevel="loud"), ErrorCode.INVALID_CONFIG, "logLevel"),
        (_conf(namespaceIsolation="maybe"), ErrorCode.INVALID_CONFIG, "namespaceIsolation"),
    ],
)
def test_bad_configs(data: bytes, code: int, words: str) -> None:
    with pytest.raises(CNIError) as caught:
        load_meta_config(data)
    assert caught.value.code == code
    assert words in str(caught.value)
