"""Prometheus metrics of the daemon, fed by the server and by the engine's step logs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cni.packages import skip_package_init

# prometheus_client/__init__.py also imports its exposition module (http.server,
# urllib.request, wsgiref: +1.5 MiB RSS); the daemon serves /metrics with its own
# server and imports the exposition only when it does (meta/daemon/http.py).
skip_package_init("prometheus_client")
from prometheus_client.metrics import Counter, Gauge, Histogram  # noqa: E402
from prometheus_client.registry import CollectorRegistry  # noqa: E402

if TYPE_CHECKING:  # the store-backed daemon never loads the API client
    from meta.sources.kube import KubeSource

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The daemon's metrics in their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "plexus_requests",
            "CNI requests by verb and result",
            ["verb", "result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "plexus_request_seconds",
            "CNI request latency by verb",
            ["verb"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "plexus_requests_in_flight", "CNI requests being served", registry=self.registry
        )
        self.queued = Gauge(
            "plexus_requests_queued",
            "CNI requests read and waiting for a worker slot",
            registry=self.registry,
        )
        self.delegate_latency = Histogram(
            "plexus_delegate_seconds",
            "Delegate call latency by verb, network and plugin",
            ["verb", "network", "delegate"],
            buckets=_BUCKETS,
            registry=self.registry,
        )

        self.writes_queued = Gauge(
            "plexus_api_writes_queued",
            "API writes (events, delayed network-status) waiting in the background queue",
            registry=self.registry,
        )
        self.writes_dropped = Counter(
            "plexus_api_writes_dropped",
            "API writes given up on, by kind (status, event) and reason "
            "(full, expired, rejected, gone)",
            ["kind", "reason"],
            registry=self.registry,
        )

        self.cached = Gauge(
            "plexus_informer_objects",
            "Objects in the informer caches, by resource",
            ["resource"],
            registry=self.registry,
        )

    def track_source(self, source: KubeSource) -> None:
        """Export the informer cache sizes and the background writer's queue; count its drops."""
        for resource, informer in (("pods", source.pods), ("nads", source.nads)):
            if informer is not None:
                self.cached.labels(resource=resource).set_function(informer.size)
        if source.writer is not None:
            self.writes_queued.set_function(source.writer.depth)
            source.writer.on_drop = lambda kind, reason: self.writes_dropped.labels(
                kind=kind, reason=reason
            ).inc()

    def step_handler(self) -> logging.Handler:
        """A log handler that turns the engine's delegate steps into latency samples."""
        return _DelegateSteps(self)


class _DelegateSteps(logging.Handler):
    def __init__(self, metrics: Metrics) -> None:
        super().__init__(level=logging.INFO)
        self.metrics = metrics

    def emit(self, record: logging.LogRecord) -> None:
        fields = record.__dict__
        if not record.getMessage().startswith("delegate ") or "ms" not in fields:
            return
        self.metrics.delegate_latency.labels(
            verb=str(fields.get("verb", "")),
            network=str(fields.get("network", "")),
            delegate=str(fields.get("delegate", "")),
        ).observe(float(fields["ms"]) / 1000)
