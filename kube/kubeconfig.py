"""Kubernetes credentials, loaded by the official client in a short-lived child process.

Importing the `kubernetes` package brings every generated API model with it: ~8-12 MiB
of the daemon's resident memory, for a client whose requests Plexus does not use. What
the daemon needs is what the client's loaders produce (server, TLS files, bearer token),
so a child process runs `load_kube_config` / `load_incluster_config` and prints that.
Token credentials are loaded again in the background every `REFRESH` seconds (the
client's in-cluster loader re-reads its token file as often), and the token in hand
keeps serving requests meanwhile.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from cni.errors import CNIError, ErrorCode

REFRESH = 60.0
LOAD_TIMEOUT = 60.0


class Credentials:
    """The parts of a `kubernetes.client.Configuration` a REST client needs."""

    def __init__(self, kubeconfig: str = "") -> None:
        self.kubeconfig = kubeconfig
        self._dir = ""
        loaded = _load(kubeconfig)
        self.host: str = loaded["host"]
        self.verify_ssl: bool = loaded["verify_ssl"]
        self.ssl_ca_cert = self._file(loaded["ssl_ca_cert"], "ca.crt")
        self.cert_file = self._file(loaded["cert_file"], "client.crt")
        self.key_file = self._file(loaded["key_file"], "client.key")
        self._token: str | None = loaded["token"]
        self._due = time.monotonic() + REFRESH
        self._refreshing = threading.Lock()
        self.refresh_api_key_hook = self._refresh if loaded["refreshes"] else None

    def get_api_key_with_prefix(self, key: str) -> str | None:
        """The Authorization header's value (`key` as the client names it)."""
        return self._token if key == "authorization" else None

    def _refresh(self, _self: Credentials) -> None:
        """Called before each request: start a background re-load once one is due."""
        if time.monotonic() < self._due or not self._refreshing.acquire(blocking=False):
            return
        self._due = time.monotonic() + REFRESH
        threading.Thread(target=self._reload, name="kube-credentials", daemon=True).start()

    def _reload(self) -> None:
        try:
            self._token = _load(self.kubeconfig)["token"]
        except CNIError:
            pass  # the current token stays; the next due refresh tries again
        finally:
            self._refreshing.release()

    def _file(self, spec: dict[str, str] | None, name: str) -> str | None:
        """The client's path if it outlived the child (kept, so a file rotated on disk is
        re-read), else a private copy: the client deletes files it made from inline data."""
        if spec is None:
            return None
        if os.path.exists(spec["path"]):
            return spec["path"]
        if not self._dir:
            self._dir = tempfile.mkdtemp(prefix="plexus-kube-")
            atexit.register(shutil.rmtree, self._dir, True)
        path = os.path.join(self._dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(spec["data"])
        return path


def _load(kubeconfig: str) -> dict[str, Any]:
    where = kubeconfig or "in-cluster service account"
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, kubeconfig],
            capture_output=True,
            text=True,
            timeout=LOAD_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CNIError(
            ErrorCode.INVALID_CONFIG, f"cannot load Kubernetes config from {where}", str(exc)
        ) from exc
    if done.returncode != 0:
        detail = done.stdout.strip() or done.stderr.strip()[-500:]
        raise CNIError(
            ErrorCode.INVALID_CONFIG, f"cannot load Kubernetes config from {where}", detail
        )
    loaded: dict[str, Any] = json.loads(done.stdout)  # our own child's json.dumps (_dump)
    return loaded


def _dump(kubeconfig: str) -> dict[str, Any]:
    """In the child: run the client's loader and describe the Configuration it built."""
    from kubernetes import config as kube_config
    from kubernetes.client import Configuration

    cfg = Configuration()
    if kubeconfig:
        kube_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=cfg
        )
    else:
        kube_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    if cfg.refresh_api_key_hook is not None:
        cfg.refresh_api_key_hook(cfg)

    def describe(path: str | None) -> dict[str, str] | None:
        if not path:
            return None
        with open(path) as f:
            return {"path": os.path.abspath(path), "data": f.read()}

    token = cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix(
        "BearerToken"
    )
    return {
        "host": cfg.host,
        "verify_ssl": bool(cfg.verify_ssl),
        "ssl_ca_cert": describe(cfg.ssl_ca_cert),
        "cert_file": describe(cfg.cert_file),
        "key_file": describe(cfg.key_file),
        "token": token,
        "refreshes": cfg.refresh_api_key_hook is not None,
    }


def main() -> None:
    try:
        print(json.dumps(_dump(sys.argv[1])))
    except Exception as exc:  # the loaders raise several unrelated types
        print(f"{type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
