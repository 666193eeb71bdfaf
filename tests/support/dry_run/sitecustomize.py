"""For `bench/gpu_verify.sh --dry-run` only (on its PYTHONPATH there, with
EDGED_GPU_DRY_RUN=1): every Python process of the rehearsal, daemons included, sees a
CUDA device called "Fake GPU (dry run)", and `server.backend = "onnxruntime-cuda"` is
tests/support/fake_gpu.py's backend, the CPU provider behind it. So every step of the
plan runs on a machine with no GPU, and each check that needs the real CUDA layer fails
into its JSON as it would on a broken GPU machine. Nothing it measures is a GPU figure.

The stand-ins are put in as edged's modules are imported, not before: a process that
never imports edged (pip, the shell's probes) starts as fast as without them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any


def _stand_in(module: ModuleType) -> None:
    if module.__name__ == "edged.backends":
        sys.path.append(str(Path(__file__).resolve().parent.parent))  # fake_gpu, last: it shadows nothing
        module.BACKENDS["onnxruntime-cuda"] = "fake_gpu:FakeGpu"
    else:  # edged.backends.cuda
        module.cuda_available = lambda: None
        module.device_info = lambda device=0: module.DeviceInfo(device, "Fake GPU (dry run)", 4 << 30, (9, 0))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the two modules as the path finder does, and runs _stand_in once each is executed."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name not in ("edged.backends", "edged.backends.cuda"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            _stand_in(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's own loader
        return spec


if os.environ.get("EDGED_GPU_DRY_RUN") == "1":
    sys.meta_path.insert(0, _AfterImport())
