"""Quantize a model of the repository to INT8 or FP8 Q/DQ ONNX and report its accuracy.

    python build_scripts/quantize.py MODEL --precision int8|fp8 [--calibration DIR]
        [--quantizer onnxruntime|modelopt] [--repository PATH]

The same as `edged build quantize`; the logic lives in edged/toolchain/quantize.py.
"""

from __future__ import annotations

import sys

from edged.cli.commands import main

if __name__ == "__main__":
    sys.exit(main(["build", "quantize", *sys.argv[1:]]))
