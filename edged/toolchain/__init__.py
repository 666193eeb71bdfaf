"""The offline toolchain: quantize (INT8/FP8 Q/DQ), convert (FP16/BF16) and build
TensorRT engines, each writing its file and manifest entry into the model's folder.
"""

from collections.abc import Callable

# How a step reports what it is doing: a line at a time (builds take minutes).
Progress = Callable[[str], None]
