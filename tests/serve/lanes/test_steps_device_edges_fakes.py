"""Which of a pipeline's edges stay on the device (Stepper.kept), on stand-ins for GPU
runners: fakes that implement edged.backends.KeepsOnDevice over a numpy "device", lending
through the real Lender, so that a lent buffer read after its runner ran again raises as
it would on the runners. Names say "fake": nothing here shows what a GPU does."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from support.gpu import MLP

from edged.backends import DeviceTensor, KeepsOnDevice, cuda_memory
from edged.models.pipeline import Pipeline, Ref, Step, waves
from edged.models.repository import ModelEntry
from edged.serve.lanes.steps import StepFailed, Stepper
from edged.serve.pricing import ServiceTimes
from edged.wire.codec import TensorSpec
from edged.wire.signature import Signature

DEVICE: dict[int, np.ndarray] = {}  # the fake device's buffers, by pointer


def model(name: str, *inputs: str) -> ModelEntry:
    """A stand-in model: float32 [-1, 4] inputs, one output y, the inputs' sum * 2 + 1."""
    specs = tuple(TensorSpec(n, "float32", (-1, 4)) for n in (*(inputs or ("x",)), "y"))
    return replace(MLP, name=name, signature=Signature(specs[:-1], specs[-1:]))


class FakeHostRunner:
    """A CPU runner: host arrays in and out, no run_keeping."""

    def __init__(self, name: str, seen: list[tuple[str, dict[str, str]]], empty: bool = False) -> None:
        self.name, self.seen, self.empty = name, seen, empty

    def compute(self, inputs: dict[str, Any]) -> np.ndarray:
        self.seen.append((self.name, {n: type(v).__name__ for n, v in inputs.items()}))
        arrays = [DEVICE[v.pointer][: v.shape[0]].copy() if isinstance(v, DeviceTensor) else v for v in inputs.values()]
        out = np.sum(arrays, axis=0) * 2 + 1
        return out[:0] if self.empty else out

    def run(self, inputs: dict[str, np.ndarray], names: Sequence[str]) -> list[Any]:
        return [self.compute(dict(inputs))]

    def close(self) -> None: ...


class FakeDeviceRunner(FakeHostRunner):
    """A GPU runner that keeps: its output lives in its own fake device buffer."""

    def __init__(self, name: str, seen: list[tuple[str, dict[str, str]]], empty: bool = False) -> None:
        super().__init__(name, seen, empty)
        self.lender = cuda_memory.Lender()
        pointer = 0x1000 * (len(DEVICE) + 1)
        DEVICE[pointer] = np.zeros((8, 4), np.float32)
        self.staged = SimpleNamespace(dtype=np.dtype(np.float32), device=SimpleNamespace(pointer=pointer, nbytes=128))

    def run_keeping(
        self,
        inputs: dict[str, np.ndarray | DeviceTensor],
        names: Sequence[str],
        keep: Collection[str],
    ) -> list[np.ndarray | DeviceTensor]:
        out = self.compute(dict(inputs))  # the inputs are read (copied) before the run, as on the runners
        self.lender.ran()
        DEVICE[self.staged.device.pointer][: len(out)] = out
        return [self.lender.lend(self.staged, out.shape) if "y" in keep else out.copy()]

    def run(self, inputs: dict[str, np.ndarray], names: Sequence[str]) -> list[Any]:
        return self.run_keeping(dict(inputs), names, ())


def step(name: str, entry: ModelEntry | None = None, **inputs: str) -> Step:
    refs = tuple(
        (param, Ref(*source.split(".")) if "." in source else Ref(None, source)) for param, source in inputs.items()
    )
    after = frozenset(ref.step for _, ref in refs if ref.step is not None)
    if entry is not None:
        return Step(name, refs, entry.signature.outputs, after, f"p/{name}", model=entry)

    def python(**given: Any) -> dict[str, np.ndarray]:
        assert all(isinstance(value, np.ndarray) for value in given.values())  # a Python step sees host arrays
        return {"x": np.sum(list(given.values()), axis=0) + 100}

    outputs = (TensorSpec("x", "float32", (-1, 4)),)
    return Step(name, refs, outputs, after, f"p/{name}", function=python, python="glue:python")


def pipeline(*steps: Step, outputs: tuple[tuple[str, str], ...]) -> Pipeline:
    refs = tuple((name, Ref(*source.split("."))) for name, source in outputs)
    return Pipeline("p", waves("p", "test", {s.name: s for s in steps}), refs)


def stepper(runner: type[FakeHostRunner], seen: list[Any], width: int = 1, **empty: bool) -> Stepper:
    runners = {name: runner(name, seen, empty.get(name, False)) for name in "abcd"}
    return Stepper(runners, ServiceTimes(), width)


def run(stepper: Stepper, p: Pipeline, rows: int = 2) -> dict[str, np.ndarray]:
    image = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    return stepper.run(p, {"image": image}, rows, 0)


A, B, C, D = model("a"), model("b"), model("c"), model("d", "x", "z")


def test_fake_device_runners_keep_a_model_to_model_edge_never_one_into_python_or_a_pipeline_output() -> None:
    p = pipeline(
        step("first", A, x="image"),
        step("second", B, x="first.y"),
        step("glue", None, x="second.y"),
        step("third", C, x="glue.x"),
        outputs=(("out", "third.y"),),
    )
    seen: list[Any] = []
    on_device = stepper(FakeDeviceRunner, seen)
    assert on_device.kept(p) == {"first": ("y",), "second": ()}
    assert on_device.kept(p) is on_device.kept(p)  # planned once
    out = run(on_device, p)
    assert seen == [("a", {"x": "ndarray"}), ("b", {"x": "DeviceTensor"}), ("c", {"x": "ndarray"})]
    host: list[Any] = []
    np.testing.assert_array_equal(out["out"], run(stepper(FakeHostRunner, host), p)["out"])
    assert isinstance(out["out"], np.ndarray)
    # An edge that is also a pipeline output comes back to the host, for the reply.
    both = pipeline(step("first", A, x="image"), step("second", B, x="first.y"), outputs=(("o", "first.y"),))
    assert stepper(FakeDeviceRunner, []).kept(both) == {}


def test_fake_device_runners_keep_no_edge_over_which_the_producing_model_runs_again() -> None:
    """first.y is read by `last` after `again` (model a, as `first`) ran: its buffer would
    hold again's output by then; the edges that nothing overwrites stay on the device."""
    p = pipeline(
        step("first", A, x="image"),
        step("second", B, x="first.y"),
        step("again", A, x="second.y"),
        step("last", D, x="first.y", z="again.y"),
        outputs=(("out", "last.y"),),
    )
    seen: list[Any] = []
    on_device = stepper(FakeDeviceRunner, seen)
    assert on_device.kept(p) == {"second": ("y",), "again": ("y",), "last": ()}
    out = run(on_device, p)
    assert seen[-1] == ("d", {"x": "ndarray", "z": "DeviceTensor"})
    np.testing.assert_array_equal(out["out"], run(stepper(FakeHostRunner, []), p)["out"])


def test_fake_device_runners_keep_the_edge_of_a_model_that_follows_itself() -> None:
    """Its next call copies the input before it overwrites its output."""
    p = pipeline(step("first", A, x="image"), step("again", A, x="first.y"), outputs=(("out", "again.y"),))
    seen: list[Any] = []
    on_device = stepper(FakeDeviceRunner, seen)
    assert on_device.kept(p) == {"first": ("y",), "again": ()}
    np.testing.assert_array_equal(run(on_device, p)["out"], run(stepper(FakeHostRunner, []), p)["out"])
    assert seen == [("a", {"x": "ndarray"}), ("a", {"x": "DeviceTensor"})]


def test_fake_device_runners_an_empty_kept_output_takes_the_zero_row_shortcut() -> None:
    p = pipeline(step("first", A, x="image"), step("second", B, x="first.y"), outputs=(("out", "second.y"),))
    seen: list[Any] = []
    out = run(stepper(FakeDeviceRunner, seen, a=True), p)
    assert seen == [("a", {"x": "ndarray"})]  # b not called: nothing to run
    assert isinstance(out["out"], np.ndarray) and out["out"].shape == (0, 4)


def test_fake_device_runners_a_lent_buffer_read_after_its_model_ran_again_fails_the_step() -> None:
    """What keeping first.y in the test above would do: the stand-ins refuse the stale read."""
    p = pipeline(
        step("first", A, x="image"),
        step("again", A, x="first.y"),
        step("last", D, x="first.y", z="again.y"),
        outputs=(("out", "last.y"),),
    )
    on_device = stepper(FakeDeviceRunner, [])
    assert on_device.kept(p) == {"again": ("y",), "last": ()}
    on_device._plans["p"] = (p, {"first": ("y",), "again": ("y",), "last": ()})  # the wrong plan, forced
    with pytest.raises(StepFailed, match=r"step 'last'.*ran again or closed"):
        run(on_device, p)


@pytest.mark.parametrize("width", [1, 2])
def test_the_cpu_path_keeps_nothing_and_its_runners_never_see_a_device_tensor(width: int) -> None:
    p = pipeline(step("first", A, x="image"), step("second", B, x="first.y"), outputs=(("out", "second.y"),))
    seen: list[Any] = []
    on_cpu = stepper(FakeHostRunner, seen, width)
    assert not isinstance(on_cpu._runners["a"], KeepsOnDevice)
    assert on_cpu.kept(p) == {}
    run(on_cpu, p)
    assert seen == [("a", {"x": "ndarray"}), ("b", {"x": "ndarray"})]
    on_cpu.close()


def test_fake_device_runners_with_branch_threads_keep_nothing() -> None:
    p = pipeline(step("first", A, x="image"), step("second", B, x="first.y"), outputs=(("out", "second.y"),))
    branching = stepper(FakeDeviceRunner, [], width=2)
    assert branching.kept(p) == {}
    branching.close()
