"""Kubernetes credentials loaded by the official client in a child process."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.errors import CNIError, ErrorCode
from kube.kubeconfig import Credentials

CA = "-----BEGIN CERTIFICATE-----\nY2E=\n-----END CERTIFICATE-----\n"
CERT = "-----BEGIN CERTIFICATE-----\nY2VydA==\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\na2V5\n-----END PRIVATE KEY-----\n"


def write_kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://10.0.0.1:6443", **cluster}}
                ],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return str(path)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_inline_data_becomes_private_files_that_outlive_the_loader(tmp_path: Path) -> None:
    config = write_kubeconfig(
        tmp_path / "kubeconfig",
        {"certificate-authority-data": b64(CA)},
        {"client-certificate-data": b64(CERT), "client-key-data": b64(KEY)},
    )
    creds = Credentials(config)
    assert creds.host == "https://10.0.0.1:6443"
    assert creds.verify_ssl
    files = [creds.ssl_ca_cert, creds.cert_file, creds.key_file]
    assert [Path(f).read_text() for f in files if f] == [CA, CERT, KEY]
    assert all(f and os.stat(f).st_mode & 0o077 == 0 for f in files)
    assert creds.refresh_api_key_hook is None
    assert creds.get_api_key_with_prefix("authorization") is None


def test_files_named_by_the_kubeconfig_are_used_in_place(tmp_path: Path) -> None:
    for name, text in (("ca.crt", CA), ("tls.crt", CERT), ("tls.key", KEY)):
        (tmp_path / name).write_text(text)
    config = write_kubeconfig(
        tmp_path / "kubeconfig",
        {"certificate-authority": str(tmp_path / "ca.crt")},
        {"client-certificate": str(tmp_path / "tls.crt"), "client-key": str(tmp_path / "tls.key")},
    )
    creds = Credentials(config)
    assert (creds.ssl_ca_cert, creds.cert_file, creds.key_file) == tuple(
        str(tmp_path / n) for n in ("ca.crt", "tls.crt", "tls.key")
    )


def test_a_token_is_the_authorization_header_and_gets_refreshed(tmp_path: Path) -> None:
    config = write_kubeconfig(
        tmp_path / "kubeconfig", {"insecure-skip-tls-verify": True}, {"token": "s3cret"}
    )
    creds = Credentials(config)
    assert creds.get_api_key_with_prefix("authorization") == "Bearer s3cret"
    assert creds.refresh_api_key_hook is not None
    assert not creds.verify_ssl


def test_a_bad_kubeconfig_is_an_invalid_config_error_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(CNIError) as err:
        Credentials(str(config))
    assert err.value.code == ErrorCode.INVALID_CONFIG
    assert str(config) in err.value.msg


def test_the_kubernetes_package_never_enters_the_caller(tmp_path: Path) -> None:
    """It costs the daemon ~8-12 MiB of RSS; only the child process imports it."""
    config = write_kubeconfig(
        tmp_path / "kubeconfig", {"insecure-skip-tls-verify": True}, {"token": "t"}
    )
    probe = (
        "import sys\n"
        "from kube.api import KubeAPI\n"
        f"KubeAPI({config!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
