"""One ONNX Runtime CPU session per model file and settings, shared by every runner
(edged.backends.shared): real sessions on real ONNX files, in this process."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

from edged.backends import Runner
from edged.backends.onnxruntime_cpu import SESSIONS, OnnxRuntimeCpu, cpu_session
from edged.config.classes import ClassConfig
from edged.loadgen.large_model import write_matmuls
from edged.models.onnx_import import write_folder
from edged.models.repository import ModelEntry, entries_of

SIDE = 2048  # three 2048x2048 float32 MatMuls: 48 MiB of weights


@pytest.fixture
def model(tmp_path: Path) -> ModelEntry:
    source = tmp_path / "matmuls.onnx"
    write_matmuls(source, SIDE, seed=1)
    manifest = write_folder(source, onnx.load(str(source)), tmp_path / "repo", "matmuls", [], {}, False)
    return entries_of(manifest, "onnxruntime")[0]


REALTIME = ClassConfig("realtime", order=0)
BULK = ClassConfig("bulk", order=2, nice=10, yields=True)
X = np.random.default_rng(7).standard_normal((1, SIDE)).astype(np.float32)


# The growth of a fresh interpreter's resident memory with one runner, then four: in this
# process, memory that earlier tests freed (and the allocator kept) hid the first copy.
RSS_PROBE = """
import sys
from pathlib import Path

from edged.backends.host_memory import rss_bytes
from edged.backends.onnxruntime_cpu import OnnxRuntimeCpu
from edged.config.classes import ClassConfig
from edged.models.repository import entries_of

model = entries_of(Path(sys.argv[1]), "onnxruntime")[0]
realtime, bulk = ClassConfig("realtime", order=0), ClassConfig("bulk", order=2, nice=10, yields=True)
backend = OnnxRuntimeCpu()
before = rss_bytes()
runners = [backend.load(model, realtime)]
one = rss_bytes() - before
runners += [backend.load(model, lane) for lane in (realtime, bulk, bulk)]
print(one / 2**20, (rss_bytes() - before) / 2**20)
"""


def test_every_lanes_runners_share_one_copy_and_answer_as_a_private_session_at_once(model: ModelEntry) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(model.manifest)], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    one, four = map(float, probe.stdout.split())
    # A session per runner held a copy each: four runners, four times one.
    assert one > 40 and four < 1.5 * one, (one, four)
    backend = OnnxRuntimeCpu()
    first = backend.load(model, REALTIME)
    others = [backend.load(model, lane) for lane in (REALTIME, BULK, BULK)]
    try:
        expected = cpu_session(model.variant.path, "fp32").run(["y"], {"x": X})[0]
        results: dict[int, np.ndarray] = {}

        def call(i: int, runner: Runner) -> None:
            for _ in range(5):
                results[i] = runner.run({"x": X}, ["y"])[0]

        threads = [threading.Thread(target=call, args=(i, r)) for i, r in enumerate([first, *others])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for out in results.values():
            np.testing.assert_array_equal(out, expected)
    finally:
        for runner in [first, *others]:
            runner.close()
    assert len(SESSIONS) == 0


def test_a_session_lives_while_a_runner_holds_it_and_a_replaced_file_is_another(model: ModelEntry) -> None:
    backend = OnnxRuntimeCpu()
    old = backend.load(model, REALTIME)
    old_out = old.run({"x": X}, ["y"])[0]
    # A reload with nothing changed: the new lane's runner takes the session the old one holds.
    again = backend.load(model, REALTIME)
    assert len(SESSIONS) == 1
    old.close()
    old.close()  # a second close gives nothing back twice
    np.testing.assert_array_equal(again.run({"x": X}, ["y"])[0], old_out)
    # The file replaced in place: another session, beside the old one until that one is given back.
    write_matmuls(model.variant.path, SIDE, seed=2)
    new = backend.load(model, REALTIME)
    assert len(SESSIONS) == 2
    assert not np.array_equal(new.run({"x": X}, ["y"])[0], old_out)
    again.close()
    new.close()
    assert len(SESSIONS) == 0


def test_a_dlpack_view_of_memory_edged_owns_is_a_shared_initializer_used_in_place(tmp_path: Path) -> None:
    """The CUDA backend's mechanism (edged.backends.dlpack), on the CPU, where it can run:
    ONNX Runtime takes an OrtValue over memory it does not own (add_initializer refuses one
    that owns its buffer) and computes from that very memory, not from a copy."""
    import onnxruntime as ort

    from edged.backends import dlpack
    from edged.backends.device_weights import shareable

    path = tmp_path / "small.onnx"
    write_matmuls(path, 64, seed=3)
    ours = {name: array.copy() for name, array in shareable(path).items()}  # writable, for the last check
    assert set(ours) == {"w0", "w1", "w2"}
    views = {name: dlpack.view(a.ctypes.data, a.shape, a.dtype, dlpack.CPU, 0) for name, a in ours.items()}
    values = {name: dlpack.ort_value(ort, view) for name, view in views.items()}
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")  # else MatMul packs a copy of its own
    for name, value in values.items():
        options.add_initializer(name, value)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    expected = cpu_session(path, "fp32").run(["y"], {"x": x})[0]
    np.testing.assert_allclose(session.run(["y"], {"x": x})[0], expected, rtol=1e-5, atol=1e-6)
    ours["w2"][:] = 0  # our memory, changed in place: the session computes from it
    assert not session.run(["y"], {"x": x})[0].any()
    del session, values


def test_the_written_model_is_one_the_gpu_build_reads(tmp_path: Path) -> None:
    """onnx writes IR version 14 unless told; onnxruntime-gpu 1.31.1 refused it on the
    first GPU machine ("max supported IR version: 13"), so the GPU checks' models failed."""
    path = tmp_path / "m.onnx"
    write_matmuls(path, 8)
    assert onnx.load(str(path)).ir_version <= 13
