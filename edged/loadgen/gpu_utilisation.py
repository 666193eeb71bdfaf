"""GPU utilisation while a benchmark scenario runs, sampled by nvidia-smi (bench/gpu_bench.py)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile


def gpu_index() -> str:
    """The device nvidia-smi should watch: the first of CUDA_VISIBLE_DEVICES (an index or a
    UUID, both of which -i takes), else 0, the device the daemon's process uses."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


def parse_utilisation(text: str) -> list[float]:
    """nvidia-smi's utilization.gpu samples, one a line (csv, noheader, nounits); lines
    that are not numbers ("[N/A]", "[Not Supported]", a warning) are skipped."""
    samples = []
    for line in text.splitlines():
        try:
            samples.append(float(line.strip()))
        except ValueError:
            continue
    return samples


class UtilisationSampler:
    """nvidia-smi sampling GPU utilisation every 100 ms while the block runs; without
    nvidia-smi, or without a sample, `median` is None and nothing fails."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.median: float | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> UtilisationSampler:
        program = shutil.which("nvidia-smi")
        if program is not None:
            self._file = tempfile.TemporaryFile()
            query = ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"]
            self._process = subprocess.Popen(
                [program, *query, "-i", gpu_index()], stdout=self._file, stderr=subprocess.DEVNULL
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._file.seek(0)
        self.samples = parse_utilisation(self._file.read().decode(errors="replace"))
        self._file.close()
        self.median = statistics.median(self.samples) if self.samples else None
