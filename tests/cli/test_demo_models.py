"""The demo models' stated properties: rebuilt byte for byte from their script, and
one light and one heavy, as the daemon serving them measures them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from support import ENGINES, REPO_ROOT, RunningDaemon, random_input

from edged.client import Client

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


def median_compute_us(client: Client, model: str, requests: int) -> float:
    """The daemon's own compute time for batch-1 realtime requests, median of `requests`."""
    inputs = random_input(model, 1, 0)
    return float(np.median([client.infer_reply(model, inputs).header["timing_us"]["compute"] for _ in range(requests)]))


def test_the_heavy_demo_model_costs_edged_far_more_than_the_light_one(daemon: RunningDaemon) -> None:
    """The demos exist to show both sides of the realtime class: one cheap enough to
    run on the socket loop, one that must run on the lane. Measured by the daemon
    itself, in one run, so the machine's speed cancels out (about 100x here)."""
    with Client(daemon.ipc) as client:
        light = median_compute_us(client, "mlp-light", 50)
        heavy = median_compute_us(client, "cnn-heavy", 50)
    assert heavy > 10 * max(light, 1.0), (light, heavy)
