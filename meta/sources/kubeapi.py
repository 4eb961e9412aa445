"""A small Kubernetes API client over urllib3: JSON requests and watch streams.

The official client is used only to load a kubeconfig or the in-cluster config (in a
child process: see meta/sources/kubeconfig.py);
requests go straight to the REST paths, so objects stay plain dicts and a watch
is one streamed response read line by line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import urllib3

from cni.errors import CNIError, ErrorCode
from meta.sources.kubeconfig import Credentials


class APIError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class KubeAPI:
    """Authenticated JSON access to one API server."""

    def __init__(self, kubeconfig: str = "", timeout: float = 10.0) -> None:
        cfg = Credentials(kubeconfig)
        self._cfg = cfg
        self.host = cfg.host.rstrip("/")
        self.timeout = timeout
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=16,
            cert_reqs="CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE",
            ca_certs=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
        )

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        if self._cfg.refresh_api_key_hook is not None:
            self._cfg.refresh_api_key_hook(self._cfg)
        headers = {
            "Accept": "application/json",
            "Content-Type": content_type,
            "User-Agent": f"plexus/{os.getpid()}",
        }
        token = self._cfg.get_api_key_with_prefix(
            "authorization"
        ) or self._cfg.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = (
                token if token.lower().startswith("bearer ") else f"Bearer {token}"
            )
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One JSON request; APIError for a non-2xx status, ConnectionError when unreachable."""
        try:
            response = self._pool.request(
                method,
                self.host + path,
                body=None if body is None else json.dumps(body).encode(),
                headers=self._headers(content_type),
                timeout=urllib3.Timeout(total=timeout or self.timeout),
                retries=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ConnectionError(f"{method} {path}: {exc}") from exc
        text = response.data.decode(errors="replace")
        if response.status >= 300:
            raise APIError(response.status, text)
        result: dict[str, Any] = json.loads(text) if text else {}
        return result

    def watch(self, path: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """Events of a watch on `path` (which already holds its query) until the server ends it."""
        try:
            response = self._pool.request(
                "GET",
                self.host + path,
                headers=self._headers(),
                preload_content=False,
                timeout=urllib3.Timeout(connect=self.timeout, read=timeout_seconds + 30),
                retries=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise ConnectionError(f"watch {path}: {exc}") from exc
        try:
            if response.status >= 300:
                raise APIError(response.status, response.read().decode(errors="replace"))
            buffer = b""
            for chunk in response.stream(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            response.release_conn()


def get_object(api: KubeAPI, path: str) -> dict[str, Any] | None:
    """GET one object; None if it does not exist, code 11 if the server cannot answer."""
    try:
        return api.request("GET", path)
    except APIError as exc:
        if exc.status == 404:
            return None
        raise CNIError(ErrorCode.TRY_AGAIN_LATER, f"GET {path} failed", str(exc)) from exc
    except OSError as exc:
        raise CNIError(
            ErrorCode.TRY_AGAIN_LATER, "the API server is unreachable", str(exc)
        ) from exc
