"""A real validating admission webhook that holds Event creates in one namespace.

The kube-apiserver calls it (HTTPS, a serving cert from the cluster's test CA) for every
Event created in the namespace, and it answers only when the test calls `release()` (or
after `HOLD_SECONDS`): a test can tell whether a client waited for its events. Events
whose reason is `Probe` pass at once; they show that the webhook is in force.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.cluster.apiserver import Cluster

HOLD_SECONDS = 8.0
CONFIG_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


class EventHold:
    """`with EventHold(cluster, namespace) as hold:` Event creates there wait for `release()`."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = f"pxt-hold-{uuid.uuid4().hex[:8]}"
        self.passed: list[str] = []  # reasons of held events let through, in order
        self.probes = 0
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    def __enter__(self) -> EventHold:
        assert self.cluster.pki is not None
        crt, key = self.cluster.pki._leaf(self.name, "/CN=webhook", "serverAuth", "IP:127.0.0.1")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(crt), str(key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.cluster.create(CONFIG_PATH, self._config())
        self._wait_in_force()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
        self.cluster.request("DELETE", f"{CONFIG_PATH}/{self.name}")
        self._server.shutdown()
        self._server.server_close()

    def release(self) -> None:
        self._release.set()

    def _config(self) -> dict[str, Any]:
        assert self.cluster.pki is not None
        port = self._server.server_address[1]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": f"{self.name}.plexus.test",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/hold",
                        "caBundle": base64.b64encode(self.cluster.pki.ca_crt.read_bytes()).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["events"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                    },
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": int(HOLD_SECONDS) + 5,
                    "failurePolicy": "Fail",
                }
            ],
        }

    def _wait_in_force(self, timeout: float = 30.0) -> None:
        """Create probe events until one reaches the webhook (its config takes a moment)."""
        deadline = time.monotonic() + timeout
        while self.probes == 0:
            assert time.monotonic() < deadline, "the admission webhook never got a request"
            self.cluster.create(
                f"/api/v1/namespaces/{self.namespace}/events",
                {
                    "metadata": {"generateName": "probe."},
                    "involvedObject": {"kind": "Pod", "namespace": self.namespace, "name": "probe"},
                    "reason": "Probe",
                    "message": "is the webhook in force?",
                },
            )
            time.sleep(0.2)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hold = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                reason = str((request.get("object") or {}).get("reason", ""))
                if reason == "Probe":
                    hold.probes += 1
                else:
                    hold._release.wait(HOLD_SECONDS)
                    with hold._lock:
                        hold.passed.append(reason)
                answer = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {"uid": request["uid"], "allowed": True},
                }
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the apiserver's calls are not test output

        return Handler
