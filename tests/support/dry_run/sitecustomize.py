"""For `bench/gpu_verify.sh --dry-run` only (on its PYTHONPATH there, with
EDGED_GPU_DRY_RUN=1): every Python process of the rehearsal, daemons included, sees a
CUDA device called "Fake GPU (dry run)", and `server.backend = "onnxruntime-cuda"` is
tests/support/fake_gpu.py's backend, the CPU provider behind it. So every step of the
plan runs on a machine with no GPU, and each check that needs the real CUDA layer fails
into its JSON as it would on a broken GPU machine. Nothing it measures is a GPU figure.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if os.environ.get("EDGED_GPU_DRY_RUN") == "1":
    try:
        from edged.backends import BACKENDS, cuda
    except ImportError:  # a process without edged on its path (pip): nothing to stand in for
        pass
    else:
        sys.path.append(str(Path(__file__).resolve().parent.parent))  # fake_gpu, last: it shadows nothing
        BACKENDS["onnxruntime-cuda"] = "fake_gpu:FakeGpu"
        cuda.cuda_available = lambda: None
        cuda.device_info = lambda device=0: cuda.DeviceInfo(device, "Fake GPU (dry run)", 4 << 30, (9, 0))
