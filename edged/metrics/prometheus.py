"""An optional Prometheus endpoint: the stats op's figures, in Prometheus's text format.

Off unless `metrics.prometheus_port` is set. It serves from prometheus_client's own
HTTP thread and, only when scraped, reads the stats op's figures there (each class's
under its stats lock), so the request path gains nothing. prometheus_client is
imported here only when the endpoint starts: it is an optional extra
(`pip install 'edged[prometheus]'`).

Latency percentiles are those of the stats op, over every request since start-up
(the daemon's own histograms), exposed as gauges in seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from edged.config import MetricsConfig
from edged.config.settings import ConfigError
from edged.daemon.lifecycle import REPORTED_STATES
from edged.metrics.histogram import PERCENTILES
from edged.metrics.server import serve_scrapes

Stats = Callable[[], dict[str, Any]]

# (stats key, metric name, help) of the per-class counters that are not outcomes
CLASS_COUNTERS = (
    ("received", "edged_requests_received", "Valid inference requests received, by class."),
    ("admitted", "edged_requests_admitted", "Requests admitted to their class's queue."),
    ("backend_calls", "edged_backend_calls", "Backend calls (one call may carry a batch of requests)."),
    ("backend_rows", "edged_backend_rows", "Rows handed to the backend."),
    ("inline", "edged_requests_inline", "Requests run on their class's loop itself (the inline path)."),
    ("late_completed", "edged_requests_late", "Requests answered OK after their deadline had passed."),
)


class StatsCollector:
    """A prometheus_client collector that turns one stats reply into metric families."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self._stats()
        classes: dict[str, dict[str, Any]] = stats["classes"]
        state = GaugeMetricFamily("edged_state", "The daemon's state: 1 for the current one.", labels=["state"])
        for name in REPORTED_STATES:
            state.add_metric([name], 1.0 if stats["state"] == name else 0.0)
        yield state
        yield CounterMetricFamily(
            "edged_invalid_requests",
            "Requests refused before any class: malformed, unknown model or class.",
            stats["invalid"],
        )
        yield CounterMetricFamily(
            "edged_unroutable_replies", "Replies whose peer was gone or not reading.", stats.get("unroutable", 0)
        )
        outcomes = CounterMetricFamily(
            "edged_requests",
            "Requests by how they ended: completed, failed, expired, or shed (queue_full, deadline, bytes).",
            labels=["class", "outcome"],
        )
        counters = {key: CounterMetricFamily(name, text, labels=["class"]) for key, name, text in CLASS_COUNTERS}
        depth = GaugeMetricFamily(
            "edged_queue_depth",
            "Requests (and re-timings of a price) waiting or running in the class.",
            labels=["class"],
        )
        latency = GaugeMetricFamily(
            "edged_latency_seconds",
            "Latency percentiles since start-up, by stage (queue, compute, total).",
            labels=["class", "stage", "quantile"],
        )
        latency_max = GaugeMetricFamily(
            "edged_latency_max_seconds", "Largest latency since start-up, by stage.", labels=["class", "stage"]
        )
        prices = GaugeMetricFamily(
            "edged_price_seconds",
            "What admission charges: a row of a size-priced model, by its elements as measured; else a call's "
            "first row (elements 'first') and each further row ('extra').",
            labels=["class", "model", "elements"],
        )
        guessed = GaugeMetricFamily(
            "edged_price_guessed",
            "1 where a size-priced model's rows larger than any measured are priced by a guess (one size "
            "measured), 0 where by the line through the two largest.",
            labels=["class", "model"],
        )
        lane_memory = GaugeMetricFamily(
            "edged_lane_memory_bytes",
            "What the lane added on the host beyond the weights as it loaded and warmed (its arenas, buffers).",
            labels=["class"],
        )
        for klass, figures in classes.items():
            if figures.get("memory_bytes") is not None:
                lane_memory.add_metric([klass], figures["memory_bytes"])
            for outcome in ("completed", "failed", "expired"):
                outcomes.add_metric([klass, outcome], figures[outcome])
            for reason, count in figures["shed"].items():
                outcomes.add_metric([klass, f"shed_{reason}"], count)
            for key, family in counters.items():
                family.add_metric([klass], figures[key])
            depth.add_metric([klass], figures["queue_depth"])
            for stage, summary in figures["latency_us"].items():
                for label, q in PERCENTILES.items():
                    latency.add_metric([klass, stage, str(q)], summary[label] / 1e6)
                latency_max.add_metric([klass, stage], summary["max"] / 1e6)
            for model, price in figures.get("prices", {}).items():
                _add_price(prices, guessed, klass, model, price)
        yield outcomes
        yield from counters.values()
        yield depth
        yield latency
        yield latency_max
        yield prices
        yield guessed
        yield lane_memory
        weights = GaugeMetricFamily(
            "edged_model_weights_bytes",
            "A model's weights, held once for all its lanes: its file's size times the copies held.",
            labels=["model"],
        )
        for model, held in stats.get("memory", {}).get("weights", {}).items():
            weights.add_metric([model], held["copies"] * held["file_bytes"])
        yield weights


def _add_price(prices: Any, guessed: Any, klass: str, model: str, price: dict[str, Any]) -> None:
    by_size = price.get("row_ms_by_elements")
    if by_size is None:
        prices.add_metric([klass, model, "first"], price["first_row_ms"] / 1e3)
        prices.add_metric([klass, model, "extra"], price["extra_row_ms"] / 1e3)
        return
    for elements, ms in by_size.items():
        prices.add_metric([klass, model, elements], ms / 1e3)
    guessed.add_metric([klass, model], 1.0 if price["past_largest"] == "guess" else 0.0)


class PrometheusEndpoint:
    """GET http://HOST:PORT/metrics, on a thread of its own, until close()."""

    def __init__(self, config: MetricsConfig, stats: Stats) -> None:
        try:
            from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
        except ImportError:
            raise ConfigError(
                f"metrics.prometheus_port = {config.prometheus_port} needs the prometheus-client package: "
                "pip install 'edged[prometheus]', or set metrics.prometheus_port = 0"
            ) from None
        # A registry of its own: only edged's figures and this process's, never another library's globals.
        registry = CollectorRegistry()
        registry.register(StatsCollector(stats))
        ProcessCollector(registry=registry)
        address = f"{config.prometheus_host}:{config.prometheus_port}"
        try:
            self._server, self._thread = serve_scrapes(
                config.prometheus_host, config.prometheus_port, make_wsgi_app(registry)
            )
        except OSError as exc:
            raise ConfigError(
                f"metrics.prometheus_port: cannot listen on {address}: {exc}; choose a free port "
                "(or check metrics.prometheus_host)"
            ) from None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
