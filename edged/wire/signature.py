"""A model's declared inputs and outputs, and the check of a request against them.

The one place where a request meets the model's metadata: backends receive only
inputs that passed here, so they stay short (the Polygraphy runner pattern).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edged.wire.codec import ProtocolError, Request, Status, TensorSpec, tensor_views
from edged.wire.tensors import DTYPES


@dataclass(frozen=True, slots=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # False where requests are never stacked whatever the shapes say (a pipeline's: its
    # dimension 0 may be an image's height), so dimension 0 counts in its size.
    stacks: bool = True
    # Derived once here: both are read for every request.
    output_names: tuple[str, ...] = field(init=False)
    batchable: bool = field(init=False)  # requests can be stacked along a dynamic first dimension
    # By input, in order: (dimension, size) of each fixed dimension.
    _fixed: tuple[tuple[tuple[int, int], ...], ...] = field(init=False)
    # An input has a dynamic dimension besides the batch (an image's height, a chunk's
    # length): a call's cost follows the request's size, not only its rows.
    sized: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_names", tuple(spec.name for spec in self.outputs))
        batchable = self.stacks and all(spec.shape and spec.shape[0] == -1 for spec in self.inputs + self.outputs)
        object.__setattr__(self, "batchable", batchable)
        fixed = tuple(tuple((i, d) for i, d in enumerate(spec.shape) if d != -1) for spec in self.inputs)
        object.__setattr__(self, "_fixed", fixed)
        sized = any(d == -1 and not (batchable and i == 0) for spec in self.inputs for i, d in enumerate(spec.shape))
        object.__setattr__(self, "sized", sized)

    def bind(self, request: Request) -> dict[str, np.ndarray]:
        """The request's inputs as arrays (views of its frames), checked against the model."""
        self.check(request)
        return tensor_views(request)

    def check(self, request: Request) -> None:
        """Raise ProtocolError unless the request's header fits the model: from the header
        alone (decoding checked each payload's length against its spec)."""
        if not self._expected(request):
            self._checked(request)

    def measure(self, request: Request) -> tuple[int, int]:
        """A checked request's rows and elements (see `rows`, `elements`), from its header."""
        rows = request.inputs[0].shape[0] if self.batchable else 1
        return rows, sum(math.prod(spec.shape) for spec in request.inputs) if self.sized else 0

    def _expected(self, request: Request) -> bool:
        """Whether `request` is the common one: the declared inputs in the declared order,
        dtypes and fixed sizes, one batch, the default outputs. A comparison per input,
        where the checked path builds sets and messages."""
        given = request.inputs
        if request.outputs is not None or len(given) != len(self.inputs):
            return False
        batch = None
        for spec, declared, fixed in zip(given, self.inputs, self._fixed):
            shape = spec.shape
            if spec.name != declared.name or spec.dtype != declared.dtype or len(shape) != len(declared.shape):
                return False
            for i, size in fixed:
                if shape[i] != size:
                    return False
            if self.batchable:
                if batch is None:
                    batch = shape[0]
                elif shape[0] != batch:
                    return False
        return True

    def _checked(self, request: Request) -> None:
        given = {spec.name: spec for spec in request.inputs}
        if len(given) != len(request.inputs):
            raise self._error(request, "an input name appears twice")
        expected = {spec.name for spec in self.inputs}
        if set(given) != expected:
            missing, extra = sorted(expected - set(given)), sorted(set(given) - expected)
            raise self._error(
                request,
                f"model {request.model!r} takes inputs {sorted(expected)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {extra}" if extra else ""),
            )
        batch: int | None = None
        for declared in self.inputs:
            spec = given[declared.name]
            if spec.dtype != declared.dtype:
                raise self._error(request, f"input {spec.name!r} must be {declared.dtype}, got {spec.dtype}")
            if len(spec.shape) != len(declared.shape) or any(
                want != -1 and want != got for want, got in zip(declared.shape, spec.shape)
            ):
                raise self._error(
                    request,
                    f"input {spec.name!r} has shape {list(spec.shape)}; the model takes "
                    f"{list(declared.shape)} (-1: any size)",
                )
            if self.batchable:
                if batch is not None and spec.shape[0] != batch:
                    raise self._error(request, "inputs disagree on the batch (first) dimension")
                batch = spec.shape[0]
        if request.outputs is not None:
            unknown = sorted(set(request.outputs) - set(self.output_names))
            if unknown:
                raise ProtocolError(
                    Status.INVALID_ARGUMENT,
                    f"model {request.model!r} has no outputs {unknown}; it has {list(self.output_names)}",
                    request.id,
                )

    def rows(self, inputs: dict[str, np.ndarray]) -> int:
        """A request's size along the batch dimension (1 for a model that does not batch)."""
        return next(iter(inputs.values())).shape[0] if self.batchable else 1

    def elements(self, inputs: dict[str, np.ndarray]) -> int:
        """A request's size as a sized model's price reads it: every element of every
        input (a fixed-size state or scalar adds the same to each); 0 when it is not sized."""
        return sum(array.size for array in inputs.values()) if self.sized else 0

    def shape_at(self, spec: TensorSpec, rows: int) -> tuple[int, ...]:
        """`spec`'s shape with `rows` rows (its own shape for a model that does not batch)."""
        return (rows, *spec.shape[1:]) if self.batchable else spec.shape

    def zeros(self, rows: int) -> dict[str, np.ndarray]:
        """Inputs of zeros for `rows` rows (1 for every other dynamic dimension): for warm-up and timing."""
        return {
            spec.name: np.zeros([max(d, 1) for d in self.shape_at(spec, rows)], dtype=DTYPES[spec.dtype])
            for spec in self.inputs
        }

    def to_wire(self) -> dict[str, Any]:
        return {
            "inputs": [spec.to_wire() for spec in self.inputs],
            "outputs": [spec.to_wire() for spec in self.outputs],
        }

    @staticmethod
    def _error(request: Request, message: str) -> ProtocolError:
        return ProtocolError(Status.INVALID_ARGUMENT, message, request.id)
