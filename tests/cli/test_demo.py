"""`edged demo`, the README's first command: it serves the demo models, shows each
answering, and stops cleanly."""

from __future__ import annotations

import subprocess
import sys


def test_the_demo_serves_each_demo_model_and_stops_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "edged", "demo", "--requests", "20"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "'state': 'serving'" in out
    for model in ("cnn-heavy", "mlp-light"):
        assert f"model {model} (onnxruntime" in out
    assert out.count("20 realtime requests, one at a time: round trip p50") == 2
    assert "daemon stopped with exit code 0" in out
    assert "Traceback" not in done.stderr
