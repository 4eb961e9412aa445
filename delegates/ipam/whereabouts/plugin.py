"""The daemon's whereabouts: the IPAM as a CNI plugin run in process, with its pool cache.

`ClusterIPAM` is made once per daemon with the daemon's API client (never one a config
names), its node name and the namespace the pools live in (whereabouts' default is
kube-system); delegates.builtin runs it wherever a hosted plugin's `ipam.type` is
`whereabouts`. With `reserve` it keeps addresses reserved ahead per pool (stock.py), the
rewrites in flight under `journal`. Verbs: ADD allocates (one address per range) and
returns them with the config's static addresses, routes and DNS (with an IPAMClaim
named: the claim's, see claims.py); DEL releases by container ID + interface; CHECK reads
the pools afresh and finds the allocation there; GC releases this node's allocations
missing from `cni.dev/valid-attachments`; STATUS says whether the API server takes a pool
write (a dry run, answered from cache for STATUS_SECONDS).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from cni import callscope
from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.result import IPConfig, Result
from delegates.ipam.whereabouts.allocator import Allocator
from delegates.ipam.whereabouts.claims import Claims, adopt, claim_reference
from delegates.ipam.whereabouts.config import WhereaboutsConfig, load_config
from delegates.ipam.whereabouts.labels import CLAIM_LABEL
from delegates.ipam.whereabouts.objects import GROUP_VERSION
from delegates.ipam.whereabouts.pools import PoolStore
from delegates.ipam.whereabouts.slices import Slices
from kube.api import KubeAPI

DEFAULT_NAMESPACE = "kube-system"
STATUS_SECONDS = 10.0
VALID_ATTACHMENTS = "cni.dev/valid-attachments"


class ClusterIPAM:
    """cni.skel.Plugin for `"ipam": {"type": "whereabouts"}`, over one API client."""

    def __init__(
        self,
        api: KubeAPI,
        node: str,
        namespace: str = DEFAULT_NAMESPACE,
        watch: bool = True,
        reserve: int = 0,
        journal: Path | None = None,
    ) -> None:
        self.api = api
        self.node = node
        self.store = PoolStore(api, namespace, watch)
        slices = Slices(api, namespace, node) if node else None
        self.allocator = Allocator(self.store, node, slices)
        self.claims = Claims(api)
        if reserve and journal is not None:
            self.allocator.reserve_ahead(reserve, journal)
        self._status: tuple[float, CNIError | None] = (0.0, None)
        self._status_lock = threading.Lock()

    def start(self) -> None:
        self.store.start()

    def stop(self) -> None:
        self.store.stop()
        self.allocator.close()

    def config(self, args: CmdArgs) -> WhereaboutsConfig:
        """The call's config, with the flat file read under the host's / (the daemon's
        chrootDir, where the exec'd whereabouts would find it)."""
        return load_config(_conf(args), args, callscope.current().root)

    def add(self, args: CmdArgs) -> Result:
        cfg = self.config(args)
        claim = claim_reference(_conf(args))
        if claim:
            ips = self._claimed(cfg, args, claim)
        else:
            ips = self.allocator.allocate(cfg, args.container_id, args.ifname)
        return Result(
            cniVersion=cfg.version,
            ips=[*ips, *cfg.addresses],
            routes=list(cfg.routes),
            dns=cfg.dns,
        )

    def _claimed(self, cfg: WhereaboutsConfig, args: CmdArgs, name: str) -> list[IPConfig]:
        """The addresses of IPAMClaim `name` (in the pod's namespace): its `status.ips`,
        else new ones, written there."""
        claim = self.claims.get(cfg.pod_namespace or "default", name)
        if (claim.get("status") or {}).get("ips"):
            return adopt(self.allocator, cfg, args.container_id, args.ifname, claim)
        labels = {CLAIM_LABEL: claim["metadata"]["uid"]}
        ips = self.allocator.allocate(cfg, args.container_id, args.ifname, labels)
        try:
            pools = sorted(self.allocator.pools_of(cfg))
            self.claims.record(claim, [str(ip.address) for ip in ips], cfg.pod_name, pools)
        except BaseException:
            self.allocator.release(cfg, args.container_id, args.ifname)
            raise
        return ips

    def delete(self, args: CmdArgs) -> None:
        """Release the container's addresses, unless an IPAMClaim holds them."""
        cfg = self.config(args)
        if not claim_reference(_conf(args)):
            self.allocator.release(cfg, args.container_id, args.ifname)

    def check(self, args: CmdArgs) -> None:
        prev = _conf(args).get("prevResult")
        reported = set()
        if isinstance(prev, dict):
            reported = set(Result.from_dict(prev).ip_strings())
        self.allocator.check(self.config(args), args.container_id, args.ifname, reported)

    def gc(self, args: CmdArgs) -> None:
        raw = _conf(args).get(VALID_ATTACHMENTS) or []
        if not isinstance(raw, list):
            raise CNIError(ErrorCode.INVALID_CONFIG, f"{VALID_ATTACHMENTS} must be a list")
        valid = {
            (str(a.get("containerID", "")), str(a.get("ifname", "")))
            for a in raw
            if isinstance(a, dict)
        }
        cfg = self.config(args)
        self.allocator.collect(
            lambda _, cid, ifname: (cid, ifname) not in valid, pools=self.allocator.pools_of(cfg)
        )

    def status(self, args: CmdArgs) -> None:
        """Ready if a pool write would be taken: a dry-run create, at most every
        STATUS_SECONDS."""
        with self._status_lock:
            checked, error = self._status
            if time.monotonic() - checked > STATUS_SECONDS:
                error = self._probe()
                self._status = (time.monotonic(), error)
        if error is not None:
            raise error

    def _probe(self) -> CNIError | None:
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": "IPPool",
            "metadata": {"generateName": "plexus-status-probe-"},
            "spec": {"range": "192.0.2.0/24", "allocations": {}},
        }
        try:
            self.api.request("POST", f"{self.store.base}/ippools?dryRun=All", body)
        except Exception as exc:  # whatever stops the write is the answer
            return CNIError(
                ErrorCode.NOT_AVAILABLE,
                "whereabouts: the API server does not take IPPool writes",
                str(exc),
            )
        return None


def _conf(args: CmdArgs) -> dict[str, Any]:
    conf = json.loads(args.stdin)
    if not isinstance(conf, dict):
        raise CNIError(ErrorCode.DECODE_FAILURE, "network config on stdin must be a JSON object")
    return conf
