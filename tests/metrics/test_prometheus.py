"""The optional Prometheus endpoint: scraped over real HTTP from a real daemon, its
figures must be the stats op's."""

from __future__ import annotations

import socket
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import RunningDaemon, free_tcp_port, random_input, run_edged, short_dir, start_daemon, wait_for

from edged.client import Client, EdgedError
from edged.config import ConfigError, MetricsConfig, parse_config

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def scraped_daemon() -> Iterator[tuple[RunningDaemon, int]]:
    port = free_tcp_port()
    running = start_daemon(f"[metrics]\nprometheus_port = {port}\n")
    yield running, port
    running.close()


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_a_scrape_reports_what_the_stats_op_reports(scraped_daemon: tuple[RunningDaemon, int]) -> None:
    running, port = scraped_daemon
    with Client(running.ipc) as client:
        for seed in range(6):
            client.infer("mlp-light", random_input("mlp-light", 1, seed), klass="realtime")
        for seed in range(3):
            client.infer("cnn-heavy", random_input("cnn-heavy", 2, seed), klass="bulk")
        # Two that do not complete: an unknown model (refused before any class) and a hopeless deadline.
        with pytest.raises(EdgedError):
            client.infer("no-such-model", random_input("mlp-light", 1, 0))
        with pytest.raises(EdgedError):
            client.infer("mlp-light", random_input("mlp-light", 1, 0), deadline_ms=0.001)
        # Shed as beyond the model's own run, it has the lane re-time the model: held work until done.
        wait_for(lambda: client.stats()["classes"]["standard"]["queue_depth"] == 0, 10, "the re-timing")
        stats: dict[str, Any] = client.stats()
    samples = scrape(port)

    assert value(samples, "edged_state", state="serving") == 1.0
    assert value(samples, "edged_invalid_requests_total") == stats["invalid"] >= 1
    assert value(samples, "edged_unroutable_replies_total") == stats["unroutable"]
    assert stats["classes"]["realtime"]["completed"] == 6 and stats["classes"]["bulk"]["completed"] == 3
    assert stats["classes"]["realtime"]["inline"] == 6  # mlp-light, on an idle realtime lane
    assert not any(name.startswith(("edged_preempted", "edged_requests_aside")) for name, _ in samples)
    # Each model's weights, once: the file's size times the copies held.
    assert set(stats["memory"]["weights"]) == {"mlp-light", "cnn-heavy"}
    for model, weights in stats["memory"]["weights"].items():
        held = weights["copies"] * weights["file_bytes"]
        assert value(samples, "edged_model_weights_bytes", model=model) == held > 0
    for klass, figures in stats["classes"].items():
        for key, name in (
            ("received", "edged_requests_received_total"),
            ("admitted", "edged_requests_admitted_total"),
            ("backend_calls", "edged_backend_calls_total"),
            ("backend_rows", "edged_backend_rows_total"),
            ("inline", "edged_requests_inline_total"),
            ("late_completed", "edged_requests_late_total"),
        ):
            assert value(samples, name, **{"class": klass}) == figures[key], (klass, key)
        for outcome in ("completed", "failed", "expired"):
            assert value(samples, "edged_requests_total", **{"class": klass, "outcome": outcome}) == figures[outcome]
        for reason, count in figures["shed"].items():
            assert value(samples, "edged_requests_total", **{"class": klass, "outcome": f"shed_{reason}"}) == count
        assert value(samples, "edged_queue_depth", **{"class": klass}) == figures["queue_depth"]
        assert value(samples, "edged_lane_memory_bytes", **{"class": klass}) == figures["memory_bytes"]
        for stage, summary in figures["latency_us"].items():
            labels = {"class": klass, "stage": stage}
            assert value(samples, "edged_latency_seconds", quantile="0.99", **labels) == pytest.approx(
                summary["p99"] / 1e6
            )
            assert value(samples, "edged_latency_max_seconds", **labels) == pytest.approx(summary["max"] / 1e6)
        # What admission charges, as stats shows it: the demo models are priced per row.
        assert set(figures["prices"]) == {"mlp-light", "cnn-heavy"}, figures["prices"]
        for model, price in figures["prices"].items():
            assert price["first_row_ms"] > 0, (klass, model, price)
            for elements in ("first", "extra"):
                labels = {"class": klass, "model": model, "elements": elements}
                assert value(samples, "edged_price_seconds", **labels) == pytest.approx(
                    price[f"{elements}_row_ms"] / 1e3
                )


def test_the_endpoint_also_reports_the_process(scraped_daemon: tuple[RunningDaemon, int]) -> None:
    _, port = scraped_daemon
    assert value(scrape(port), "process_resident_memory_bytes") > 0


def test_a_port_in_use_stops_start_up_naming_the_key() -> None:
    folder = short_dir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = folder / "edged.toml"
        config.write_text(f"[metrics]\nprometheus_port = {taken.getsockname()[1]}\n")
        result = run_edged("serve", "--config", str(config), "--endpoint", f"ipc://{folder}/d.sock")
    assert result.returncode == 2
    assert "metrics.prometheus_port" in result.stderr


def test_it_is_off_by_default_and_bound_to_loopback() -> None:
    assert parse_config({}, base_dir=Path("/")).metrics == MetricsConfig(prometheus_port=0, prometheus_host="127.0.0.1")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[metrics]\nprometheus_port = -1", "metrics.prometheus_port"),
        ("[metrics]\nprometheus_port = 65536", "metrics.prometheus_port"),
        ('[metrics]\nprometheus_port = "9464"', "metrics.prometheus_port"),
        ("[metrics]\nprometheus_host = 127", "metrics.prometheus_host"),
        ('[metrics]\nprometheus_host = ""', "metrics.prometheus_host"),
        ("[metrics]\nport = 9464", "metrics.port"),
    ],
)
def test_invalid_metrics_setting_is_refused_naming_its_key(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(tomllib.loads(text), base_dir=Path("/"))
    assert key in str(caught.value)


def test_idle_connections_to_the_endpoint_hold_few_descriptors_and_serving_goes_on(
    scraped_daemon: tuple[RunningDaemon, int],
) -> None:
    """Any local user reaches the port. Each idle connection held a thread and a descriptor for
    as long as its client kept it: by the thousand they used up the daemon's descriptors and
    its steering thread failed, stopping it. Now a few are served at once, each for seconds."""
    running, port = scraped_daemon
    descriptors = Path(f"/proc/{running.pid}/fd")
    before = len(list(descriptors.iterdir()))
    idle = []
    try:
        for _ in range(100):
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            connection.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
            idle.append(connection)
        time.sleep(0.5)
        held = len(list(descriptors.iterdir())) - before
        assert held <= 20, f"{held} descriptors held for 100 idle connections"
        with Client(running.ipc) as client:
            assert client.infer("mlp-light", random_input("mlp-light", 1, 0))["scores"].shape == (1, 10)
    finally:
        for connection in idle:
            connection.close()
    wait_for(lambda: scrape_or_none(port) is not None, 30, "a scrape once the idle connections are gone")
    assert running.alive()


def scrape_or_none(port: int) -> Samples | None:
    try:
        return scrape(port)
    except OSError:
        return None
