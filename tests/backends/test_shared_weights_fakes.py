"""Weights once on the GPU, on fakes of CUDA, ONNX Runtime's CUDA provider and TensorRT
(tests/support/fake_cuda.py): every lane runner of a model takes the process's one copy
(edged.backends.device_weights, edged.backends.tensorrt_engines), the last to give it
back frees it, a replaced file is another copy, and the plan counts each once. The
fake device counts live allocations, so "one copy" here is one allocation of edged's;
that ONNX Runtime's CUDA provider then uses it in place is what only a GPU can show
(bench/gpu_checks.py weights).
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from support.fake_cuda import FakeCuda, FakeTrt
from support.gpu import MLP, REALTIME, fake_ort

from edged.backends import onnxruntime_cuda, onnxruntime_cuda_runner, tensorrt
from edged.backends.device_weights import DEVICE_WEIGHTS, shareable, weights_key
from edged.backends.tensorrt_engines import ENGINES
from edged.config import ClassConfig
from edged.models.engines import EngineRecord, ShapeRange
from edged.models.repository import ModelEntry

BULK = ClassConfig("bulk", order=1, max_batch=4, stream_priority=0)


def backend(monkeypatch: pytest.MonkeyPatch, log: list[str]) -> onnxruntime_cuda.OnnxRuntimeCuda:
    fake_ort(monkeypatch, log)
    return onnxruntime_cuda.OnnxRuntimeCuda()


def copied(model: ModelEntry, folder: Path) -> ModelEntry:
    """`model` served from a copy of its file in `folder`, which a test may replace."""
    path = folder / "model.onnx"
    shutil.copyfile(model.variant.path, path)
    return replace(model, variant=replace(model.variant, path=path))


def replace_file(path: Path) -> None:
    """A new file at `path` (another inode), as an import or a deploy writes it."""
    fresh = path.with_suffix(".new")
    shutil.copyfile(path, fresh)
    fresh.replace(path)


def test_fake_ort_two_lanes_of_one_model_share_one_device_copy_and_the_last_close_frees_it(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    cuda = backend(monkeypatch, log)
    cuda.reserve([MLP], [REALTIME, BULK], cuda.free_bytes())
    realtime = cuda.load(MLP, REALTIME)
    bulk = cuda.load(MLP, BULK)
    # One upload, one allocation beside the runners' own buffers: the model's weights once.
    assert log.count("upload") == 1 and len(DEVICE_WEIGHTS) == 1
    weights = [s["options"].initializers for s in cuda._ort.sessions]
    assert len(weights) == 2 and weights[0] == weights[1]  # the very same OrtValues in both sessions
    assert set(weights[0]) == set(shareable(MLP.variant.path)) != set()
    assert {value.device for value in weights[0].values()} == {(2, 0)}  # kDLCUDA, device 0
    key = weights_key(MLP, onnxruntime_cuda_runner.DEVICE)
    realtime.close()
    assert DEVICE_WEIGHTS.holds(key)  # bulk still runs on them
    del log[:]
    bulk.close()
    assert not DEVICE_WEIGHTS.holds(key)
    assert log.index("session.freed") < log.index("device.free")  # freed after the session that used them


def test_fake_ort_a_replaced_file_is_another_copy_beside_the_old_until_the_old_runner_closes(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda, tmp_path: Path
) -> None:
    cuda = backend(monkeypatch, log)
    model = copied(MLP, tmp_path)
    cuda.reserve([model], [REALTIME], cuda.free_bytes())
    old = cuda.load(model, REALTIME)
    replace_file(model.variant.path)
    plan = cuda.weights_plan(model, [REALTIME])
    assert (plan.new_copies, plan.draining) == (1, 1)  # loaded beside the old, and the plan says so
    new = cuda.load(model, REALTIME)
    assert log.count("upload") == 2 and len(DEVICE_WEIGHTS) == 2
    old.close()
    assert len(DEVICE_WEIGHTS) == 1 and cuda.weights_plan(model, [REALTIME]).draining == 0
    new.close()


def test_fake_ort_the_plan_counts_weights_once_and_a_reload_with_the_copy_held_counts_none(
    monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda
) -> None:
    cuda = backend(monkeypatch, log)
    classes = [REALTIME, BULK, replace(BULK, name="standard")]
    plan = cuda.weights_plan(MLP, classes)
    assert (plan.copies, plan.new_copies, plan.planned_bytes) == (1, 1, MLP.variant.path.stat().st_size)
    lanes = cuda.reserve([MLP], classes, 1 << 40)
    needed = sum(lane.device_bytes for lane in lanes.values()) + plan.planned_bytes
    cuda.reserve([MLP], classes, needed)  # the weights once beside three lanes: it fits exactly
    with pytest.raises(ValueError, match=r"model mlp-light's weights .* but Fake GPU has"):
        cuda.reserve([MLP], classes, needed - 1)
    held = cuda.hold_weights(MLP, classes)
    assert held.weights.added_bytes == sum(fake_cuda.held.values()) > 0  # measured: the one copy's allocation
    # A reload that changes nothing: a new backend, the serving lanes' copy still held.
    again = backend(monkeypatch, log)
    reloaded = again.weights_plan(MLP, classes)
    assert (reloaded.new_copies, reloaded.planned_bytes) == (0, 0)
    again.reserve([MLP], classes, needed - plan.planned_bytes)  # nothing new to fit
    reheld = again.hold_weights(MLP, classes)
    assert reheld.weights.added_bytes == 0 and log.count("upload") == 1
    held.release()
    reheld.release()


# --- TensorRT -----------------------------------------------------------------------


def engine_model(folder: Path, trt: FakeTrt) -> ModelEntry:
    """mlp-light with one engine built for the fake GPU and runtime."""
    source = copied(MLP, folder).variant.path
    engine = folder / "model.fp32.plan"
    engine.write_bytes(b"a serialized engine")
    shapes = {"x": ShapeRange((1, 64), (4, 64), (8, 64))}
    record = EngineRecord(
        "fp32",
        engine.name,
        hashlib.sha256(engine.read_bytes()).hexdigest(),
        source.name,
        hashlib.sha256(source.read_bytes()).hexdigest(),
        trt.__version__,
        False,
        "Fake GPU",
        (9, 0),
        (shapes,),
        "2026-01-01T00:00:00Z",
    )
    return replace(MLP, variant=replace(MLP.variant, backend="tensorrt", path=folder, engines=(record,)))


@pytest.fixture
def trt(monkeypatch: pytest.MonkeyPatch, log: list[str], fake_cuda: FakeCuda) -> FakeTrt:
    fake = FakeTrt(log)
    monkeypatch.setattr(tensorrt, "import_tensorrt", lambda: (fake, False))
    return fake


def test_fake_trt_lanes_of_one_model_share_one_engine_each_with_its_own_context(
    log: list[str], fake_cuda: FakeCuda, trt: FakeTrt, tmp_path: Path
) -> None:
    model = engine_model(tmp_path, trt)
    backend = tensorrt.TensorRt()
    plan = backend.weights_plan(model, [REALTIME, BULK])
    assert (plan.copies, plan.new_copies) == (1, 1)
    runners = [backend.load(model, klass) for klass in (REALTIME, BULK, BULK)]
    assert log.count("engine.deserialize") == 1 and len(ENGINES) == 1
    assert all(runner._context is not None for runner in runners) and len({id(r._context) for r in runners}) == 3
    # Each context's activation memory, allocated per runner: three buffers of the engine's size.
    assert sorted(fake_cuda.held.values()).count(trt.engine.device_memory_size_v2) == 3
    assert backend.describe(model) == {"engine": {"file": "model.fp32.plan", "context_bytes_per_worker": 1024}}
    assert backend.weights_plan(model, [REALTIME]).new_copies == 0
    for runner in runners[:2]:
        runner.close()
    assert len(ENGINES) == 1  # the last runner still holds it
    runners[2].close()
    assert len(ENGINES) == 0


def test_fake_trt_a_replaced_engine_file_is_another_engine(
    log: list[str], fake_cuda: FakeCuda, trt: FakeTrt, tmp_path: Path
) -> None:
    model = engine_model(tmp_path, trt)
    old = tensorrt.TensorRt().load(model, REALTIME)
    replace_file(tmp_path / "model.fp32.plan")
    reloaded = tensorrt.TensorRt()  # a reload: a new backend, which chooses again
    plan = reloaded.weights_plan(model, [REALTIME])
    assert (plan.new_copies, plan.draining) == (1, 1)
    held = reloaded.hold_weights(model, [REALTIME])
    assert log.count("engine.deserialize") == 2 and len(ENGINES) == 2
    old.close()
    held.release()
    assert len(ENGINES) == 0
