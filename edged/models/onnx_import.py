"""`edged import`: a repository folder and its manifest, written from an ONNX file's own metadata.

Names, dtypes and shapes come from the graph's inputs (initializers left out) and
outputs; a dimension with no fixed size (a symbol such as "batch", or none) is
written as -1, dynamic.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from edged.models.repository import MANIFEST, RepositoryError, sha256_of
from edged.models.warmup import FILLS
from edged.wire.codec import TensorSpec
from edged.wire.endpoints import FILE_NAME
from edged.wire.tensors import DTYPES

_WIRE_NAME = {np.dtype(dtype): name for name, dtype in DTYPES.items()}


def read_specs(model: onnx.ModelProto) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The model's inputs and outputs as manifest entries {name, dtype, shape}."""
    graph = model.graph
    weights = {init.name for init in graph.initializer}
    inputs = [_spec(value) for value in graph.input if value.name not in weights]
    return inputs, [_spec(value) for value in graph.output]


def _spec(value: onnx.ValueInfoProto) -> dict[str, Any]:
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise RepositoryError(f"{value.name!r} is not a tensor (a sequence or a map): edged serves tensors only")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    if dtype not in _WIRE_NAME:
        raise RepositoryError(f"{value.name!r} has dtype {dtype}, which the wire does not carry: {sorted(DTYPES)}")
    shape = [dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else -1 for dim in tensor.shape.dim]
    return {"name": value.name, "dtype": _WIRE_NAME[dtype], "shape": shape}


def parse_shapes(items: list[str]) -> list[dict[str, list[int]]]:
    """`--shape NAME=1x512` options as warm-up samples' shapes ("NAME=" for a 0-d scalar):
    the k-th option naming an input goes into sample k, and an input named fewer times
    keeps its last shape in the later samples."""
    given: dict[str, list[list[int]]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not re.fullmatch(r"(\d+(x\d+)*)?", text):
            raise RepositoryError(f"--shape takes NAME=SIZExSIZE..., such as input=1x512; got {item!r}")
        given.setdefault(name, []).append([int(d) for d in text.split("x")] if text else [])
    count = max((len(shapes) for shapes in given.values()), default=0)
    return [{name: shapes[min(k, len(shapes) - 1)] for name, shapes in given.items()} for k in range(count)]


def parse_data(items: list[str]) -> dict[str, str | float]:
    """`--data NAME=VALUE` options as the warm-up samples' data: "zeros", "random" or a number."""
    data: dict[str, str | float] = {}
    for item in items:
        name, sep, text = item.partition("=")
        value = text if text in FILLS else _number(text)
        if not sep or value is None:
            raise RepositoryError(f"--data takes NAME=zeros, NAME=random or NAME=NUMBER, e.g. sr=16000; got {item!r}")
        data[name] = value
    return data


def _number(text: str) -> float | None:
    if re.fullmatch(r"-?\d+", text):
        return int(text)  # an int stays one in the manifest: a sample rate reads 16000, not 16000.0
    try:
        return float(text)
    except ValueError:
        return None


def read_source(source: Path) -> onnx.ModelProto:
    """The ONNX file's graph and metadata (its weights must live in the file itself)."""
    try:
        model = onnx.load(str(source), load_external_data=False)
    except Exception as exc:
        raise RepositoryError(f"{source} cannot be read as an ONNX model: {exc}") from None
    if any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer):
        raise RepositoryError(f"{source} keeps its weights in external files: save it as one file first")
    return model


def input_specs(model: onnx.ModelProto) -> list[TensorSpec]:
    """The model's inputs as the wire describes them."""
    return [TensorSpec(spec["name"], spec["dtype"], tuple(spec["shape"])) for spec in read_specs(model)[0]]


def pinned(spec: dict[str, Any], sizes: dict[str, list[int]]) -> dict[str, Any]:
    """`spec` with each dynamic dimension after the first fixed at its size in `sizes`: the
    manifest's shape is what the daemon checks a request against. The first stays dynamic
    (the batch: requests of one size still stack)."""
    shape = spec["shape"]
    if -1 not in shape[1:]:
        return spec
    given = sizes.get(spec["name"])
    if given is None or len(given) != len(shape):
        raise RepositoryError(
            f"--pin fixes {spec['name']!r} {shape} at the size given: add --shape {spec['name']}="
            + "x".join(str(max(d, 1)) for d in shape)
            + " with its sizes"
        )
    return {**spec, "shape": [d if d != -1 or axis == 0 else given[axis] for axis, d in enumerate(shape)]}


def check_free(repository: Path, name: str, replace: bool) -> Path:
    """REPOSITORY/NAME, refused where it exists and `replace` was not given, or where NAME is
    no folder name of its own: '.', '..' or a path would put the model, and `replace`'s
    removal, on the repository itself or outside it."""
    if not FILE_NAME.fullmatch(name):
        raise RepositoryError(
            f"--name {name!r} is not a model name: use letters, digits, '.', '_' and '-', "
            "not starting with '.' (it names a folder of the repository)"
        )
    folder = repository / name
    if folder.exists() and not replace:
        raise RepositoryError(f"{folder} exists: choose another --name, or give --replace to overwrite it")
    return folder


def write_folder(
    source: Path,
    model: onnx.ModelProto,
    repository: Path,
    name: str,
    samples: list[dict[str, list[int]]],
    data: dict[str, str | float],
    replace: bool,
    pin: bool = False,
) -> Path:
    """Copy `source` into REPOSITORY/NAME/model.onnx beside a manifest; returns the manifest's path.
    `pin`: the inputs accept the one sample's size alone (see `pinned`)."""
    inputs, outputs = read_specs(model)
    if pin:
        inputs = [pinned(spec, samples[0]) for spec in inputs]
    folder = check_free(repository, name, replace)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    target = folder / "model.onnx"
    shutil.copyfile(source, target)
    manifest: dict[str, Any] = {
        "name": name,
        "description": f"imported from {source.name}",
        "inputs": inputs,
        "outputs": outputs,
        "variants": [{"precision": "fp32", "backend": "onnxruntime", "file": target.name, "sha256": sha256_of(target)}],
    }
    if samples or data:
        manifest["warmup"] = [{"shapes": shapes, **({"data": data} if data else {})} for shapes in samples or [{}]]
    path = folder / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path
