"""The one small interface every runtime sits behind, and the table that names them.

A backend loads a model for one lane and returns a Runner; a Runner runs a batch.
Backends are imported lazily by name, so the daemon never imports a runtime it
does not use (and the server never imports one at all).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry

if TYPE_CHECKING:
    from edged.backends.gpu_memory import LaneReservation
    from edged.backends.shared import Weights, WeightsHold

BACKENDS = {
    "onnxruntime": "edged.backends.onnxruntime_cpu:OnnxRuntimeCpu",
    "onnxruntime-cuda": "edged.backends.onnxruntime_cuda:OnnxRuntimeCuda",
    "tensorrt": "edged.backends.tensorrt:TensorRt",
}

# Backends that serve another backend's repository variants: ONNX Runtime's CUDA
# provider runs the very ONNX files that its CPU provider does.
VARIANTS_OF = {"onnxruntime-cuda": "onnxruntime"}


class BackendError(RuntimeError):
    """A backend that cannot be used here; the message says why and how to fix it."""


# ONNX Runtime is an extra (its CPU and GPU builds must not be installed together): what
# a command that needs it says where neither is installed.
NO_RUNTIME = (
    "ONNX Runtime, which is not installed: pip install 'edged[cpu]' for the CPU default, or 'edged[gpu]' "
    "on a GPU box (from a checkout: pip install -e '.[cpu]')"
)


class DeviceMemory(Protocol):
    """Device memory a client shared with the daemon (a CUDA IPC region), opened by a
    backend that is `OpeningIpc`; it closes itself once nothing references it."""

    pointer: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class DeviceTensor:
    """An input already in device memory: what a runner gets in place of an array for an
    input in a CUDA IPC region. A GPU runner copies it device to device on its lane's
    stream; it is never batched with other requests. Holding it keeps `memory` open."""

    memory: DeviceMemory
    offset: int
    nbytes: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def pointer(self) -> int:
        return self.memory.pointer + self.offset

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Runner(Protocol):
    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """Run one (possibly batched) call; inputs were checked against the signature. An
        input may be a DeviceTensor on a backend that is `OpeningIpc`, never on another."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class KeepsOnDevice(Protocol):
    """A GPU runner that can leave outputs on the device (optional): a pipeline's
    model-to-model edge then costs one device-to-device copy into the next runner's
    input buffer, not a download and an upload (edged.serve.lanes.steps)."""

    def run_keeping(
        self,
        inputs: dict[str, np.ndarray | DeviceTensor],
        output_names: Sequence[str],
        keep: Collection[str],
    ) -> list[np.ndarray | DeviceTensor]:
        """As `run`, but each output named in `keep` comes back as a DeviceTensor over this
        runner's own output buffer, valid until its next call or `close` (reading it later
        raises); the stream is synchronized first, so its bytes are there. The others are
        downloaded as `run` does."""
        ...


class Backend(Protocol):
    def load(self, model: ModelEntry, lane: ClassConfig) -> Runner:
        """Load `model` for one worker of `lane`; called on that worker's own thread."""
        ...


@runtime_checkable
class Reserving(Protocol):
    """A backend that holds GPU memory per lane (optional): it plans how much, by class,
    before any lane loads, and refuses lanes that would not fit; the loader measures
    each lane through `free_bytes` (edged.backends.gpu_memory)."""

    device_name: str

    def free_bytes(self) -> int:
        """The device's free memory now."""
        ...

    def reserve(
        self, models: Sequence[ModelEntry], classes: Sequence[ClassConfig], free_bytes: int
    ) -> dict[str, LaneReservation]:
        """Every class's plan; refused whole when together they exceed `free_bytes`."""
        ...

    def warm_context(self, models: Sequence[ModelEntry]) -> int:
        """Load and free a throwaway session before any lane, so that the process's one-time
        costs on the device (the CUDA context's modules, the libraries' first handles) are
        not counted in the first lane's memory; returns what they took."""
        ...


@runtime_checkable
class SharingWeights(Protocol):
    """A backend whose runners of one model share one copy of its weights (optional,
    edged.backends.shared): the loader plans and takes each model's copy before any lane
    loads, so that it is counted once and measured alone."""

    def weights_plan(self, model: ModelEntry, classes: Sequence[ClassConfig]) -> Weights:
        """The copies `classes`' lanes will need of `model`'s weights, and how many are new."""
        ...

    def hold_weights(self, model: ModelEntry, classes: Sequence[ClassConfig]) -> WeightsHold:
        """Take those copies now, measured (`Weights.added_bytes`); raises ModelFailure."""
        ...


@runtime_checkable
class Describing(Protocol):
    """A backend that says how it runs a model beyond its variant (optional): what it
    decided at load, shown with the model in the `models` op's reply."""

    def describe(self, model: ModelEntry) -> dict[str, Any]:
        """Fields to add to `model`'s entry in `models` (none: {}); called after its lanes load."""
        ...


@runtime_checkable
class OpeningIpc(Protocol):
    """A GPU backend that reads clients' device memory (optional): the socket loop opens a
    CUDA IPC region through it, once, at registration, and hands its runners DeviceTensors."""

    def open_ipc(self, handle: bytes, nbytes: int) -> DeviceMemory:
        """Open the allocation `handle` exports, at least `nbytes` long; raises BackendError
        with a sentence for the client."""
        ...


def fixed_rows(backend: Backend) -> bool:
    """Whether `backend`'s runners hold buffers of `max_batch` rows, allocated at load:
    then a request with more rows than its class's max_batch is refused at admission.
    A backend says so with a class attribute `fixed_rows = True`; the CPU's has none."""
    return bool(getattr(backend, "fixed_rows", False))


def computes_on_caller(runner: Runner) -> bool:
    """Whether `runner`'s calls compute on the calling thread alone (the CPU backend's, in
    a lane of one thread): then that thread's CPU time is what a call costs, and the time
    it waited for a core is the box's contention, not the model's price. A runner says so
    with an attribute `computes_on_caller = True`; a GPU's, whose thread waits on the
    device, has none, and its calls are priced by the clock on the wall."""
    return bool(getattr(runner, "computes_on_caller", False))


def backend_named(name: str, fallback: str | None = None) -> Backend:
    """Import and build the backend registered as `name`; `fallback` (server.fallback,
    checked in config to go with "tensorrt" only) names where models it cannot run go."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r} (server.backend): choose one of {', '.join(BACKENDS)}")
    module_name, class_name = BACKENDS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != "onnxruntime":
            raise
        raise BackendError(f"server.backend = {name!r} needs {NO_RUNTIME}") from None
    backend = getattr(module, class_name)
    return backend(fallback) if fallback else backend()
