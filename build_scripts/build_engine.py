"""Build a TensorRT engine of one precision for this GPU into the model repository.

    python build_scripts/build_engine.py MODEL --precision fp16|bf16|int8|fp8|fp32
        [--min-batch N --opt-batch N --max-batch N] [--version-compatible] [--timing-cache FILE]

The same as `edged build engine`; the logic lives in edged/toolchain/engine.py. Needs an
NVIDIA GPU and TensorRT's builder (`pip install tensorrt` from NVIDIA's index).
"""

from __future__ import annotations

import sys

from edged.cli.commands import main

if __name__ == "__main__":
    sys.exit(main(["build", "engine", *sys.argv[1:]]))
