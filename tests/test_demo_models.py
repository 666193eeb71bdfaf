"""The demo models' stated properties: rebuilt byte for byte from their script, and
one light (well under a millisecond) and one heavy (a few milliseconds) at batch 1."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from support import ENGINES, MODEL_INPUTS, REPO_ROOT

MODELS = ("mlp-light", "cnn-heavy")


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("engines")
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "build_scripts" / "make_demo_models.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


@pytest.mark.parametrize("model", MODELS)
def test_rebuilding_gives_the_committed_files_byte_for_byte(rebuilt: Path, model: str) -> None:
    for name in ("model.onnx", "manifest.json"):
        assert (rebuilt / model / name).read_bytes() == (ENGINES / model / name).read_bytes(), name


@pytest.mark.parametrize("model", MODELS)
def test_manifest_matches_the_model_file(model: str) -> None:
    manifest = json.loads((ENGINES / model / "manifest.json").read_text())
    (variant,) = manifest["variants"]
    data = (ENGINES / model / variant["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == variant["sha256"]
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    declared = [(spec["name"], [d if d != -1 else None for d in spec["shape"]]) for spec in manifest["inputs"]]
    actual = [(i.name, [d if isinstance(d, int) else None for d in i.shape]) for i in session.get_inputs()]
    assert declared == actual


def batch1_median_ms(model: str, runs: int) -> float:
    # As a lane runs it: one intra-op thread, no spinning.
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(ENGINES / model / "model.onnx"), options, providers=["CPUExecutionProvider"])
    name, shape = MODEL_INPUTS[model]
    inputs = {name: np.random.default_rng(0).standard_normal((1, *shape), dtype=np.float32)}
    for _ in range(5):
        session.run(None, inputs)
    times = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        session.run(None, inputs)
        times.append((time.perf_counter_ns() - start) / 1e6)
    return float(np.median(times))


def test_light_model_is_well_under_a_millisecond() -> None:
    assert batch1_median_ms("mlp-light", runs=200) < 1.0


def test_heavy_model_takes_a_few_milliseconds() -> None:
    assert 0.5 < batch1_median_ms("cnn-heavy", runs=30) < 50.0
