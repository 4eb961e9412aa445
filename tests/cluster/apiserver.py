"""A throwaway control plane for tests: real etcd plus kube-apiserver on loopback.

`Cluster.start()` generates a PKI with the openssl CLI, starts etcd and kube-apiserver
(built by scripts/build-go-tools.sh) on free loopback ports with all state in one temp dir,
waits for /readyz, writes a kubeconfig for an admin in system:masters and applies the NAD
CRD. `Cluster.stop()` terminates its processes by PID and removes the temp dir. There is
no scheduler, controller-manager or kubelet, so pods stay Pending, unless a test calls
`start_controllers()` (kube-controller-manager with the controllers DaemonSets need, and
kube-scheduler), which `stop_controllers()` ends again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
NAD_CRD = REPO / "crds" / "network-attachment-definition.yaml"
NAD_GROUP_VERSION = "k8s.cni.cncf.io/v1"
TOOLS = Path(os.environ.get("PLEXUS_GO_TOOLS", "/var/cache/plexus-go-tools")) / "bin"
REQUIRED = ("etcd", "kube-apiserver")
CONTROLLERS = ("kube-controller-manager", "kube-scheduler")
# What DaemonSets and their pods need: the DaemonSet controller; service-account tokens and
# the kube-root-ca.crt ConfigMap (a pod's projected token volume); the garbage collector,
# which deletes a deleted DaemonSet's pods; the ResourceClaim controller, which makes a pod's
# claims from its ResourceClaimTemplates; the namespace controller, which finishes a
# namespace's deletion (an uninstall's `kubectl delete -k` waits for it). Nothing else runs
# (not the node lifecycle controller: see tests/cluster/twonodes.py).
KCM_CONTROLLERS = (
    "daemonset-controller",
    "namespace-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "garbage-collector-controller",
    "resourceclaim-controller",
)
SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
ADMIN_USER = "plexus-admin"
FIELD_MANAGER = "plexus-tests"
START_TIMEOUT = 60.0

Json = dict[str, Any]


# One audit line per request once answered: lets tests count what a client asked for.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
"""


def audit_events(path: Path, user_agent_prefix: str) -> list[dict[str, Any]]:
    """Audit events of requests whose User-Agent starts with `user_agent_prefix`."""
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("userAgent", "").startswith(user_agent_prefix)]


class ApiError(Exception):
    """A non-2xx answer from the apiserver."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class StartError(RuntimeError):
    """etcd or kube-apiserver did not come up; the message carries the log tail."""


def binary(name: str) -> Path:
    return TOOLS / name


def missing_binaries() -> list[str]:
    """Names of the binaries this harness needs that are not built."""
    return [n for n in REQUIRED if not os.access(binary(n), os.X_OK)]


def free_ports(count: int) -> list[int]:
    """Distinct loopback TCP ports that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]
"""Exec through this: SIGKILL when the test process dies, so nothing outlives it. Not a
preexec_fn: forking without vfork in a process running grpc's threads (the DRA tests)
now and then aborted the child before its exec (seen once with kube-scheduler)."""


class _Pki:
    """A CA, the apiserver's serving cert, an admin client cert and the SA key pair."""

    def __init__(self, root: Path) -> None:
        root.mkdir()
        self.root = root
        self.ca_crt, self.ca_key = root / "ca.crt", root / "ca.key"
        self._openssl(
            "req", "-x509", "-new", "-nodes", *self._ec_key(self.ca_key),
            "-subj", "/CN=plexus-test-ca", "-days", "2", "-out", str(self.ca_crt),
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        self.serving_crt, self.serving_key = self._leaf(
            "apiserver",
            "/CN=kube-apiserver",
            "serverAuth",
            f"IP:127.0.0.1,IP:{SERVICE_IP},DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc",
        )
        self.admin_crt, self.admin_key = self._leaf(
            "admin", f"/O=system:masters/CN={ADMIN_USER}", "clientAuth"
        )
        self.sa_key, self.sa_pub = root / "sa.key", root / "sa.pub"
        self._openssl("genpkey", *self._ec_args(), "-out", str(self.sa_key))
        self._openssl("pkey", "-in", str(self.sa_key), "-pubout", "-out", str(self.sa_pub))

    @staticmethod
    def _ec_args() -> tuple[str, ...]:
        return ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1")

    @staticmethod
    def _ec_key(key: Path) -> tuple[str, ...]:
        return ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", str(key))

    @staticmethod
    def _openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    def _leaf(self, name: str, subject: str, usage: str, san: str = "") -> tuple[Path, Path]:
        crt, key, csr, ext = (self.root / f"{name}.{s}" for s in ("crt", "key", "csr", "ext"))
        lines = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature",
            f"extendedKeyUsage={usage}",
        ]
        if san:
            lines.append(f"subjectAltName={san}")
        ext.write_text("\n".join(lines) + "\n")
        self._openssl(
            "req", "-new", "-nodes", *self._ec_key(key), "-subj", subject, "-out", str(csr)
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca_crt), "-CAkey", str(self.ca_key),
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "2",
            "-extfile", str(ext), "-out", str(crt),
        )  # fmt: skip
        return crt, key


class Cluster:
    """A running etcd + kube-apiserver pair, reachable as an admin over mTLS."""

    def __init__(self, root: Path, apiserver_args: Sequence[str] = ()) -> None:
        self.root = root
        self.apiserver_args = list(apiserver_args)  # extra flags; later ones win
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.pki: _Pki | None = None
        self.server = ""
        self.kubeconfig = root / "kubeconfig"
        self.audit_log = root / "audit.log"
        self.startup_seconds = 0.0
        self._ssl: ssl.SSLContext | None = None
        self._resources: dict[str, list[Json]] = {}

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def running(cls, apiserver_args: Sequence[str] = ()) -> Iterator[Cluster]:
        """Start a cluster for the duration of the `with` block; always clean up."""
        cluster = cls(Path(tempfile.mkdtemp(prefix="plexus-cluster-")), apiserver_args)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()

    def start(self) -> None:
        began = time.monotonic()
        self.pki = _Pki(self.root / "pki")
        self._ssl = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        self._ssl.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
        etcd_url = self._retry_ports("etcd", self._start_etcd)
        self._retry_ports("kube-apiserver", lambda: self._start_apiserver(etcd_url))
        # apiextensions answers ~1 s before /readyz: apply the CRD now, so its settling
        # (see _wait_crd_served) overlaps the rest of the apiserver's start-up.
        crd = self.apply(yaml.safe_load(NAD_CRD.read_text()))
        self._wait("kube-apiserver", lambda: self.get("/readyz", raw=True) == "ok")
        self._write_kubeconfig()
        self._wait_crd_served(crd["metadata"]["name"])
        # What kube-controller-manager would do: pods need their namespace's `default` SA.
        self.create_namespace("default")
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Terminate every process this cluster started (by PID), then remove its dir."""
        self.stop_controllers()
        for name in ("kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                self._terminate(proc)
        shutil.rmtree(self.root, ignore_errors=True)

    def start_controllers(self) -> None:
        """kube-controller-manager and kube-scheduler as the admin, serving no port; ready
        once the controller-manager has published kube-root-ca.crt."""
        assert self.pki is not None
        common = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--secure-port=0"]
        self._spawn(
            "kube-controller-manager",
            [
                *common,
                f"--controllers={','.join(KCM_CONTROLLERS)}",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_crt}",
                "--v=1",
            ],
        )
        self._spawn("kube-scheduler", [*common, "--v=1"])
        for name in CONTROLLERS:
            self._wait(name, self._published_root_ca)

    def _published_root_ca(self) -> bool:
        try:
            self.get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    def stop_controllers(self) -> None:
        for name in CONTROLLERS:
            proc = self.procs.pop(name, None)
            if proc is not None:
                self._terminate(proc)

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = self.root / f"{name}.log"
        self.logs[name] = log
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*DIE_WITH_PARENT, str(binary(name)), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )
        self.procs[name] = proc
        return proc

    def _log_tail(self, name: str, lines: int = 30) -> str:
        try:
            text = self.logs[name].read_text(errors="replace")
        except (KeyError, OSError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _retry_ports(self, name: str, start: Callable[[], str]) -> str:
        """Run `start` (spawn + wait), trying fresh ports if the process lost a port race."""
        for _ in range(3):
            try:
                return start()
            except StartError as err:
                proc = self.procs.pop(name)
                self._terminate(proc)
                if "address already in use" not in str(err):
                    raise
        raise StartError(f"{name}: no free ports after 3 tries")

    def _wait(self, name: str, ready: Callable[[], bool], timeout: float = START_TIMEOUT) -> None:
        """Poll `ready()` until true; fail early (with the log tail) if the process exits."""
        proc = self.procs[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise StartError(f"{name} exited with {proc.returncode}:\n{self._log_tail(name)}")
            with contextlib.suppress(OSError, ApiError):
                if ready():
                    return
            time.sleep(0.05)
        raise StartError(f"{name} not ready after {timeout:.0f} s:\n{self._log_tail(name)}")

    def _start_etcd(self) -> str:
        client, peer = (f"http://127.0.0.1:{p}" for p in free_ports(2))
        data = self.root / "etcd"
        shutil.rmtree(data, ignore_errors=True)  # left by an attempt that lost a port race
        self._spawn(
            "etcd",
            [
                "--name=plexus-test",
                f"--data-dir={data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=plexus-test={peer}",
                "--unsafe-no-fsync",  # throwaway data: skip fsync, much faster writes
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                return bool(json.load(resp).get("health") == "true")

        self._wait("etcd", healthy)
        return client

    def _start_apiserver(self, etcd_url: str) -> str:
        assert self.pki is not None
        pki, (port,) = self.pki, free_ports(1)
        self.server = f"https://127.0.0.1:{port}"
        policy = self.root / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        self._spawn(
            "kube-apiserver",
            [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # 1.37 refuses a loopback advertise address for the `kubernetes` Service's
                # endpoints; nothing reads them (the nodes relay its ClusterIP themselves).
                "--endpoint-reconciler-type=none",
                f"--secure-port={port}",
                f"--cert-dir={self.root / 'certs'}",
                f"--etcd-servers={etcd_url}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--client-ca-file={pki.ca_crt}",
                f"--tls-cert-file={pki.serving_crt}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",  # as every real cluster that runs CNI DaemonSets
                "--profiling=false",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-mode=blocking",
                "--v=0",
                *self.apiserver_args,
            ],
        )
        self._wait("kube-apiserver", lambda: bool(self.get("/apis/apiextensions.k8s.io/v1")))
        return self.server

    def _write_kubeconfig(self) -> None:
        assert self.pki is not None
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "plexus-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki.ca_crt),
                    },
                }
            ],
            "users": [
                {
                    "name": ADMIN_USER,
                    "user": {
                        "client-certificate": str(self.pki.admin_crt),
                        "client-key": str(self.pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {"name": "plexus-test", "context": {"cluster": "plexus-test", "user": ADMIN_USER}}
            ],
            "current-context": "plexus-test",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))

    def _wait_crd_served(self, name: str, timeout: float = 30.0) -> None:
        """Wait until the CRD's objects can be used at full speed.

        That is: Established, in discovery, storage initialised (the first list of a fresh
        CR storage answers 429), and 2 s past the Established transition, since the CR
        handler sleeps 2 s in every create that comes sooner.
        """
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        deadline = time.monotonic() + timeout
        while True:
            crd = self.get(path)
            group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
            served = [f"{group}/{v['name']}" for v in crd["spec"]["versions"] if v["served"]]
            since = next(
                (
                    c["lastTransitionTime"]
                    for c in crd.get("status", {}).get("conditions", [])
                    if c["type"] == "Established" and c["status"] == "True"
                ),
                None,
            )
            with contextlib.suppress(ApiError):
                if since and all(self.find_resource(gv, plural, refresh=True) for gv in served):
                    for gv in served:
                        self.get(f"/apis/{gv}/{plural}")
                    break
            if time.monotonic() > deadline:
                raise StartError(f"CRD {name} not served after {timeout:.0f} s")
            time.sleep(0.05)
        settled = datetime.fromisoformat(since).timestamp() + 2.05
        time.sleep(max(0.0, settled - time.time()))

    def client_certificate(self, name: str, user: str, groups: Sequence[str] = ()) -> Path:
        """A client cert + key (one PEM file) for `user` in `groups`, signed by the cluster CA."""
        assert self.pki is not None
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        crt, key = self.pki._leaf(name, subject, "clientAuth")
        pem = self.pki.root / f"{name}.pem"
        pem.write_bytes(crt.read_bytes() + key.read_bytes())
        return pem

    def kubeconfig_of(self, pem: Path, path: Path) -> Path:
        """The admin's kubeconfig with `pem` (client_certificate's) as its user, at `path`."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        config["users"][0]["user"] = {"client-certificate": str(pem), "client-key": str(pem)}
        path.write_text(yaml.safe_dump(config))
        return path

    # -- REST ------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        raw: bool = False,
    ) -> Any:
        """One call as the admin; the decoded JSON answer (text if `raw`)."""
        assert self._ssl is not None
        url = self.server + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = None
        if body is not None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=30) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as err:
            raise ApiError(method, path, err.code, err.read().decode(errors="replace")) from err
        return text if raw else json.loads(text)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def create(self, path: str, body: Json) -> Json:
        result: Json = self.request("POST", path, body)
        return result

    def merge_patch(self, path: str, patch: Json) -> Json:
        result: Json = self.request(
            "PATCH", path, patch, content_type="application/merge-patch+json"
        )
        return result

    def find_resource(
        self, group_version: str, name_or_kind: str, *, refresh: bool = False
    ) -> Json:
        """The discovery entry of a top-level resource by plural name or kind ({} if none)."""
        if refresh or group_version not in self._resources:
            base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
            try:
                self._resources[group_version] = self.get(base)["resources"]
            except ApiError as err:
                if err.status != 404:
                    raise
                self._resources[group_version] = []
        for res in self._resources[group_version]:
            if "/" not in res["name"] and name_or_kind in (res["name"], res["kind"]):
                return dict(res)
        return {}

    def object_path(self, obj: Json) -> str:
        """The REST path of a manifest's object, found through discovery."""
        api_version, meta = obj["apiVersion"], obj["metadata"]
        res = self.find_resource(api_version, obj["kind"])
        if not res:
            raise KeyError(f"{api_version} {obj['kind']} not served")
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if res["namespaced"]:
            base += f"/namespaces/{meta.get('namespace', 'default')}"
        return f"{base}/{res['name']}/{meta['name']}"

    def apply(self, obj: Json, *, dry_run: bool = False, manager: str = FIELD_MANAGER) -> Json:
        """Server-side apply one manifest (optionally as a dry run)."""
        query = {"fieldManager": manager}
        if dry_run:
            query["dryRun"] = "All"
        result: Json = self.request(
            "PATCH",
            self.object_path(obj),
            obj,
            content_type="application/apply-patch+yaml",
            query=query,
        )
        return result

    def create_namespace(self, name: str) -> None:
        """Create a namespace (if new) with the `default` ServiceAccount pods need."""
        for path, obj in (
            ("/api/v1/namespaces", {"metadata": {"name": name}}),
            (f"/api/v1/namespaces/{name}/serviceaccounts", {"metadata": {"name": "default"}}),
        ):
            try:
                self.create(path, obj)
            except ApiError as err:
                if err.status != 409:
                    raise
