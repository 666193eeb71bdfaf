"""The tables of `edged models`, `stats` and `health` for the replies a serving daemon
rarely gives the shared test daemon: still starting, a model that failed, a model priced
by its size. The replies are shaped as docs/protocol.md gives them."""

from __future__ import annotations

from edged.cli.tables import health_table, models_table, stats_table

STARTING_HEALTH = {
    "state": "starting",
    "ready": False,
    "uptime_s": 0.399,
    "lanes": {},
    "failed_models": {},
    "ingress": {},
}
STARTING_STATS = {"state": "starting", "invalid": 0, "unroutable": 0, "memory": {"rss_bytes": 52428800}, "classes": {}}


def test_a_starting_daemon_says_so_in_a_line() -> None:
    assert health_table(STARTING_HEALTH) == "starting, not ready, up 0.4 s"
    assert stats_table(STARTING_STATS) == "starting: 50.0 MiB resident, 0 invalid, 0 unroutable; no class serves yet"
    assert models_table([], STARTING_STATS, STARTING_HEALTH) == "starting: no model served"


def test_a_failed_model_gets_a_line_with_its_reason_and_a_price_by_size_says_so() -> None:
    ocr = {
        "name": "ocr",
        "backend": "onnxruntime",
        "precision": "fp32",
        "inputs": [{"name": "image", "dtype": "uint8", "shape": [1, -1, -1, 3]}],
        "outputs": [{"name": "text", "dtype": "int64", "shape": [-1]}],
    }
    prices = {"ocr": {"row_ms_by_elements": {"4096": 1.5}, "past_largest": "guess"}}
    stats = {**STARTING_STATS, "state": "serving", "classes": {"standard": {"prices": prices}}}
    health = {**STARTING_HEALTH, "state": "serving", "failed_models": {"big": "warm-up failed at shape [1, 9]"}}
    assert models_table([ocr], stats, health).splitlines() == [
        "NAME  BACKEND      PRECISION  INPUTS                  OUTPUTS         STANDARD MS",
        "ocr   onnxruntime  fp32       image uint8[1,-1,-1,3]  text int64[-1]  by size",
        "failed model big: warm-up failed at shape [1, 9]",
    ]
    assert health_table(health).splitlines()[-1] == "failed model big: warm-up failed at shape [1, 9]"
