"""A backend for in-process lane tests: the real ONNX Runtime one, wrapped to count,
fail or hold what reaches it."""

from __future__ import annotations

import threading
import time

from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
from edged.config.classes import ClassConfig
from edged.models.repository import ModelEntry

POISON = -999.0  # a value the failing wrapper refuses to run


class CountingBackend:
    """The real ONNX Runtime backend; counts rows run, fails any call holding a POISON
    row (or, while `failing`, every call), returns `broken` instead of a counted call's
    outputs where set (a runner's bug) or, where `truncated` is set, only that many rows
    of a larger call's, and, while `gate` is clear, holds each counted call at its start
    (`entered` is set once a call waits there)."""

    def __init__(self) -> None:
        self.rows = 0
        self.calls: list[int] = []
        self.counting = False
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.failing = False
        self.broken: object = None
        self.truncated = 0
        self._real = OnnxRuntimeCpu()

    def load(self, model: ModelEntry, lane: ClassConfig) -> CountingRunner:
        return CountingRunner(self, self._real.load(model, lane))


class CountingRunner:
    def __init__(self, owner: CountingBackend, runner) -> None:
        self._owner, self._runner = owner, runner

    def run(self, inputs, output_names):
        first = next(iter(inputs.values()))
        if self._owner.counting:
            self._owner.rows += first.shape[0]
            self._owner.calls.append(first.shape[0])
            self._owner.entered.set()
            assert self._owner.gate.wait(timeout=30), "the test never opened the gate"
        if self._owner.failing or (first == POISON).any():
            raise RuntimeError("poisoned row")
        if self._owner.counting and self._owner.broken is not None:
            return self._owner.broken
        outputs = self._runner.run(inputs, output_names)
        if self._owner.counting and self._owner.truncated and len(first) > self._owner.truncated:
            return [output[: self._owner.truncated] for output in outputs]
        return outputs

    def close(self) -> None:
        self._runner.close()


class KeyedGates:
    """The real ONNX Runtime backend, whose calls, once `armed`, are held where the first
    element of their first input is a key of `gates` (`entered[key]` set on arrival), and
    each last `delay_s` longer; a load of a model in `failing` fails, and `open_runners`
    counts those loaded and not yet closed."""

    def __init__(self) -> None:
        self.real = OnnxRuntimeCpu()
        self.armed = False
        self.delay_s = 0.0
        self.loads = 0
        self.failing: set[str] = set()
        self.open_runners = 0
        self.gates: dict[float, threading.Event] = {}
        self.entered: dict[float, threading.Event] = {}

    def gate(self, key: float) -> threading.Event:
        """A gate for calls led by `key`, closed until set."""
        self.gates[key], self.entered[key] = threading.Event(), threading.Event()
        return self.gates[key]

    def load(self, model: ModelEntry, lane: ClassConfig) -> KeyedRunner:
        self.loads += 1
        if model.name in self.failing:
            raise RuntimeError("out of device memory (a test's)")
        self.open_runners += 1
        return KeyedRunner(self, self.real.load(model, lane))


class KeyedRunner:
    def __init__(self, owner: KeyedGates, runner) -> None:
        self._owner, self._runner = owner, runner

    def run(self, inputs, output_names):
        owner = self._owner
        if owner.armed:
            first = next(iter(inputs.values()))
            key = float(first.reshape(-1)[0]) if first.size else None
            if key in owner.gates:
                owner.entered[key].set()
                assert owner.gates[key].wait(timeout=60), "the test never opened the gate"
            time.sleep(owner.delay_s)
        return self._runner.run(inputs, output_names)

    def close(self) -> None:
        self._owner.open_runners -= 1
        self._runner.close()
