"""TensorRT engines as the process holds them: one deserialized engine per engine file (a
model and precision), shared by every lane runner of it, each of which makes its own
execution context (edged.backends.tensorrt). Freed by its last holder, the engine before
its runtime. A reload whose engine file did not change finds the engine its old lanes hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.backends import BackendError
from edged.backends.shared import Key, Shared
from edged.models.engines import EngineRecord
from edged.models.repository import sha256_of


@dataclass(eq=False)
class Engine:
    """A deserialized engine and the runtime that must outlive it."""

    runtime: Any
    engine: Any

    def close(self) -> None:
        self.engine = None  # its last reference: TensorRT destroys it here, before its runtime
        self.runtime = None


@dataclass(frozen=True, slots=True)
class Chosen:
    """The engine file this GPU runs for a model, and its registry key."""

    path: Path
    record: EngineRecord
    key: Key


def _free(held: Engine) -> None:
    held.close()


ENGINES: Shared[Engine] = Shared(free=_free)


def deserialize(trt: Any, chosen: Chosen) -> Engine:
    """The engine at `chosen.path`, checked against its manifest record first."""
    path = chosen.path
    data = path.read_bytes()
    if sha256_of(path) != chosen.record.sha256:
        raise BackendError(f"{path}: its sha256 differs from the manifest's: the file changed after the build")
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    if chosen.record.version_compatible:
        # A version-compatible plan carries the lean runtime's host code; we trust our own builds.
        runtime.engine_host_code_allowed = True
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise BackendError(f"{path}: TensorRT could not deserialize it (see the TensorRT log above)")
    return Engine(runtime, engine)
