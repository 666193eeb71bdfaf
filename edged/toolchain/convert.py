"""FP16 and BF16 copies of a model's FP32 ONNX, for TensorRT's strongly typed builds.

A strongly typed network takes each tensor's type from the ONNX graph, so the
precision has to be in the file. Inputs and outputs stay FP32 in both: the wire
protocol and every client keep talking float32, and the casts run on the GPU.

- FP16: onnxconverter-common's `convert_float_to_float16` (optional extra
  `edged[build]`), the converter ONNX Runtime's own docs point to.
- BF16: no maintained converter exists, and the graph change is small: every float
  initializer and Constant becomes bfloat16, a Cast follows each float input and
  precedes each float output. ONNX Runtime's CPU provider has no bfloat16 Gemm or
  Conv kernels, so a BF16 model is checked here with ONNX's reference evaluator.
  A model below opset 22 is first moved to opset 22, where Conv takes bfloat16
  (TensorRT's ONNX parser reads opset 22 from TensorRT 10.8 on).
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, version_converter

from edged.models.manifest import ModelFolder
from edged.models.repository import sha256_of

PRECISIONS = ("fp16", "bf16")
BF16_OPSET = 22
FP16_HINT = "FP16 conversion needs onnxconverter-common: `pip install 'edged[build]'` (or onnxconverter-common)"


class ConvertError(RuntimeError):
    """A conversion that cannot be done here; the message says why and what to do."""


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        from onnxconverter_common.float16 import convert_float_to_float16
    except ImportError:
        raise ConvertError(FP16_HINT) from None
    return convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False)


def to_bf16(model: onnx.ModelProto) -> onnx.ModelProto:
    # Conv and the pooling ops take bfloat16 only from opset 22 on (Gemm from 13).
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < BF16_OPSET:
        model = version_converter.convert_version(model, BF16_OPSET)
        model.ir_version = max(model.ir_version, 10)  # opset 22 needs IR version 10
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    graph = converted.graph
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT:
            graph.initializer[index].CopyFrom(_bf16_tensor(tensor))
    for node in graph.node:
        for attribute in node.attribute:
            if node.op_type == "Constant" and attribute.name == "value" and attribute.t.data_type == TensorProto.FLOAT:
                attribute.t.CopyFrom(_bf16_tensor(attribute.t))
    casts_in, casts_out = [], []
    for value in graph.input:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = f"{value.name}__bf16"
            _rename_uses(graph, value.name, inner)
            casts_in.append(helper.make_node("Cast", [value.name], [inner], to=TensorProto.BFLOAT16))
    for value in graph.output:
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            inner = f"{value.name}__bf16"
            for node in graph.node:
                node.output[:] = [inner if name == value.name else name for name in node.output]
            _rename_uses(graph, value.name, inner)
            casts_out.append(helper.make_node("Cast", [inner], [value.name], to=TensorProto.FLOAT))
    nodes = [*casts_in, *graph.node, *casts_out]
    del graph.node[:]
    graph.node.extend(nodes)
    # Intermediate types were float; shape inference writes them again as bfloat16.
    del graph.value_info[:]
    return onnx.shape_inference.infer_shapes(converted, strict_mode=True)


def _bf16_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    values = numpy_helper.to_array(tensor).astype(ml_dtypes.bfloat16)
    return helper.make_tensor(
        tensor.name, TensorProto.BFLOAT16, list(values.shape), values.view(np.uint16).tobytes(), raw=True
    )


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]


def convert(folder: ModelFolder, precision: str) -> Path:
    """Write model.PRECISION.onnx beside the FP32 model and record it in the manifest.

    The variant names the onnxruntime backend only for FP16, which the CPU provider
    runs; a BF16 file is recorded as a TensorRT source, never served by the CPU daemon.
    """
    if precision not in PRECISIONS:
        raise ConvertError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    source = folder.source()
    model = onnx.load(str(source))
    converted = to_fp16(model) if precision == "fp16" else to_bf16(model)
    onnx.checker.check_model(converted, full_check=True)
    target = folder.path / f"{source.stem}.{precision}.onnx"
    target.write_bytes(converted.SerializeToString(deterministic=True))
    folder.put_variant(
        {
            "precision": precision,
            "backend": "onnxruntime" if precision == "fp16" else "onnx-source",
            "file": target.name,
            "sha256": sha256_of(target),
            "source_sha256": sha256_of(source),
        },
        same=("precision", "file"),
    )
    return target
