"""TensorRT end to end: build an engine from a demo model and run it in the backend.

Needs an NVIDIA GPU, cuda-python and TensorRT's builder; skipped with the reason
anywhere else (CI, and every machine of this project so far: see docs/engines.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from support import ENGINES, Reference, random_input

from edged.backends.cuda import cuda_available

pytestmark = pytest.mark.gpu


def _tensorrt_missing() -> str | None:
    reason = cuda_available()  # before TensorRT: without a device it can crash the process
    if reason is not None:
        return reason
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "TensorRT's builder is not installed (pip install tensorrt, from NVIDIA's index)"
    return None


MISSING = _tensorrt_missing()


@pytest.mark.skipif(MISSING is not None, reason=f"needs a GPU with TensorRT: {MISSING}")
def test_fp32_engine_builds_and_matches_onnxruntime(tmp_path: Path) -> None:
    from edged.backends.tensorrt import TensorRt
    from edged.config import ClassConfig
    from edged.models.manifest import ModelFolder
    from edged.models.repository import discover
    from edged.toolchain.engine import BatchRange, build_engine

    shutil.copytree(ENGINES / "mlp-light", tmp_path / "mlp-light")
    record = build_engine(ModelFolder(tmp_path, "mlp-light"), "fp32", BatchRange(1, 4, 8))
    assert (tmp_path / "mlp-light" / record.file).is_file()
    (entry,) = discover(tmp_path, "tensorrt")
    runner = TensorRt().load(entry, ClassConfig("standard", order=0, max_batch=8))
    x = random_input("mlp-light", 4, seed=2)
    out = runner.run(x, ["scores"])[0]
    runner.close()
    np.testing.assert_allclose(out, Reference().run("mlp-light", x), atol=1e-2)
