"""The `edged` client commands, run as a user runs them: a separate process, its exit
code, and what it prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from support import Reference, RunningDaemon

TIMING_LINE = re.compile(r"^timing \(us, inside the daemon\): queue \d+, compute \d+, total \d+$", re.M)


def edged(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_models_prints_the_served_models_as_json(daemon: RunningDaemon) -> None:
    result = edged("models", "--endpoint", daemon.ipc)
    assert result.returncode == 0, result.stderr
    models = {model["name"]: model for model in json.loads(result.stdout)}
    assert set(models) == {"mlp-light", "cnn-heavy"}
    assert models["mlp-light"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 64]}]


def test_health_prints_serving(daemon: RunningDaemon) -> None:
    result = edged("health", "--endpoint", daemon.tcp)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "serving"


def test_stats_prints_every_class(daemon: RunningDaemon) -> None:
    result = edged("stats", "--endpoint", daemon.ipc)
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)["classes"]) == {"realtime", "standard", "bulk"}


def test_endpoint_comes_from_the_environment(daemon: RunningDaemon) -> None:
    result = edged("health", env={"EDGED_ENDPOINT": daemon.ipc})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "serving"


def test_infer_prints_outputs_and_timing(daemon: RunningDaemon) -> None:
    result = edged("infer", "mlp-light", "--endpoint", daemon.ipc)
    assert result.returncode == 0, result.stderr
    assert "scores: float32 [1, 10]" in result.stdout
    assert TIMING_LINE.search(result.stdout), result.stdout


def test_infer_with_an_input_file_and_repeats(daemon: RunningDaemon, reference: Reference, tmp_path: Path) -> None:
    x = np.random.default_rng(5).standard_normal((2, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    result = edged(
        "infer", "mlp-light", "--endpoint", daemon.ipc, "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "3"
    )
    assert result.returncode == 0, result.stderr
    assert "scores: float32 [2, 10]" in result.stdout
    assert TIMING_LINE.search(result.stdout)
    assert re.search(r"^3 requests: total p50 \d+ us, p99 \d+ us$", result.stdout, re.M), result.stdout
    # The printed numbers are the model's (array2string rounds them to 4 decimals).
    printed = result.stdout.split("scores: float32 [2, 10]\n", 1)[1].split("timing", 1)[0]
    values = np.array([float(v) for v in re.findall(r"-?\d+\.\d*(?:e[-+]\d+)?", printed)])
    np.testing.assert_allclose(values, reference.run("mlp-light", {"x": x}).ravel(), atol=1e-3)


def test_infer_of_an_unknown_model_exits_1_saying_so(daemon: RunningDaemon) -> None:
    result = edged("infer", "resnet", "--endpoint", daemon.ipc)
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr and "resnet" in result.stderr


def test_infer_in_an_unknown_class_exits_1_with_the_daemons_message(daemon: RunningDaemon) -> None:
    result = edged("infer", "mlp-light", "--endpoint", daemon.ipc, "--class", "nope")
    assert result.returncode == 1
    assert "unknown class 'nope'" in result.stderr


def test_no_daemon_exits_1_saying_no_reply(short_tmp: Path) -> None:
    result = edged("health", "--endpoint", f"ipc://{short_tmp}/nobody.sock", "--timeout-ms", "300")
    assert result.returncode == 1
    assert "no reply" in result.stderr
