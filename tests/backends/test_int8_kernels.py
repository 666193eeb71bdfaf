"""INT8 judged as TensorRT computes it, whatever the CPU: the quantizer's check and the
CPU daemon's choice of kernels (edged.backends.int8_kernels).

A CPU without VNNI, whose fused INT8 kernels saturate, is emulated with qemu-user
(`qemu-x86_64 -cpu EPYC-Milan`: AVX2, neither AVX-512 nor VNNI). It runs the real Python,
the real ONNX Runtime and the real daemon, on an emulated CPU; the tests that use it say
so in their names and are skipped where qemu-x86_64 is not installed (.ci/run installs it
on Debian). Its timings mean nothing; its arithmetic is the emulated CPU's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import version_converter
from onnx.reference import ReferenceEvaluator
from support import ENGINES, random_input, start_daemon

from edged.backends.int8_kernels import AGREES
from edged.backends.onnxruntime_cpu import cpu_session
from edged.client import Client
from edged.models.accuracy import compare
from edged.models.manifest import ModelFolder
from edged.toolchain.calibration import held_out
from edged.toolchain.quantize import Quantized, quantize

QEMU = shutil.which("qemu-x86_64")
WITHOUT_VNNI = [QEMU or "qemu-x86_64", "-cpu", "EPYC-Milan"]
needs_qemu = pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 (Debian's qemu-user) is not installed")
BOUND = 0.99  # mlp-light INT8's minimum cosine against FP32, as tests/toolchain/test_quantize.py holds it
HELD_OUT = 64

# The quantizer's check, run in a child process (under qemu, on the emulated CPU): both figures as JSON.
CHECK = """
import dataclasses, json, sys
from pathlib import Path
from edged.models.manifest import ModelFolder
from edged.toolchain.calibration import held_out
from edged.toolchain.quantize import check_accuracy
folder = ModelFolder(Path(sys.argv[1]), "mlp-light")
graph, cpu = check_accuracy(folder, folder.path / "model.int8.onnx", "int8", held_out(folder.inputs, int(sys.argv[2])))
print(json.dumps({"graph": dataclasses.asdict(graph), "cpu": dataclasses.asdict(cpu)}))
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo") / "engines"
    shutil.copytree(ENGINES / "mlp-light", root / "mlp-light")
    return root


@pytest.fixture(scope="module")
def quantized(repository: Path) -> Quantized:
    return quantize(ModelFolder(repository, "mlp-light"), "int8", held_out_count=HELD_OUT)


def test_the_check_is_the_qdq_graphs_own_math_as_the_reference_evaluator_computes_it(
    quantized: Quantized, repository: Path
) -> None:
    """ONNX's reference evaluator runs the graph op by op in numpy, with no CPU kernel in
    the way: the check's figure must be its figure."""
    folder = ModelFolder(repository, "mlp-light")
    samples = held_out(folder.inputs, HELD_OUT)
    fp32 = cpu_session(folder.source(), "fp32").run(None, samples)[0]
    # The reference evaluator implements DequantizeLinear from opset 19 on; the quantizer writes 17.
    graph = version_converter.convert_version(onnx.load(str(quantized.path)), 21)
    evaluated = compare(fp32, ReferenceEvaluator(graph).run(None, samples)[0])
    assert quantized.accuracy.cosine_min == pytest.approx(evaluated.cosine_min, abs=1e-5)
    assert quantized.accuracy.max_abs_error == pytest.approx(evaluated.max_abs_error, abs=1e-4)


@needs_qemu
def test_emulated_cpu_without_vnni_gives_the_same_check_and_reports_its_own_kernels_beside(
    quantized: Quantized, repository: Path
) -> None:
    done = subprocess.run(
        [*WITHOUT_VNNI, sys.executable, "-c", CHECK, str(repository), str(HELD_OUT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.splitlines()[-1])
    graph, cpu = figures["graph"], figures["cpu"]
    # Without this the emulated CPU would have VNNI after all, and the test would prove nothing.
    assert cpu["cosine_min"] < BOUND, f"the emulated CPU's fused kernels did not saturate: {cpu}"
    assert graph["cosine_min"] == pytest.approx(quantized.accuracy.cosine_min, abs=1e-5)
    assert graph["cosine_min"] >= BOUND


@needs_qemu
def test_emulated_cpu_without_vnni_quantize_command_prints_both_reports(tmp_path: Path) -> None:
    shutil.copytree(ENGINES / "mlp-light", tmp_path / "mlp-light")
    command = ["build", "quantize", "mlp-light", "--precision", "int8", "--repository", str(tmp_path)]
    done = subprocess.run(
        [*WITHOUT_VNNI, sys.executable, "-m", "edged", *command], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    graph, fused = done.stdout.split("this CPU's fused integer kernels differ")
    assert "the Q/DQ graph's math" in graph and "serves the graph unfused here" in fused
    cosine = [float(re.search(r"cosine \(min, mean\)\s+([0-9.]+)", part)[1]) for part in (graph, fused)]
    assert cosine[0] >= BOUND > cosine[1]


@needs_qemu
def test_emulated_cpu_without_vnni_serves_int8_unfused_at_its_checked_accuracy_and_says_so(
    quantized: Quantized, repository: Path
) -> None:
    config = f'[server]\nmodel_repository = "{repository}"\nmodels = ["mlp-light", "mlp-light:int8"]\n'
    daemon = start_daemon(config, program=[*WITHOUT_VNNI, sys.executable, "-m", "edged"])
    try:
        with Client(daemon.ipc, timeout_ms=60_000) as client:
            kernels = {m["name"]: m.get("cpu_int8") for m in client.models()}
            x = random_input("mlp-light", 32, seed=9)
            # Emulated, 32 rows took 230 ms on one box: past the default class's 200 ms
            # deadline, and shed. What this test checks is accuracy, not speed.
            fp32 = client.infer("mlp-light", x, deadline_ms=20_000)["scores"]
            int8 = client.infer("mlp-light:int8", x, deadline_ms=20_000)["scores"]
        log = daemon.log()
    finally:
        daemon.close()
    assert kernels["mlp-light"] is None
    served = kernels["mlp-light:int8"]
    assert served["kernels"] == "unfused" and served["fused_cosine_min"] < AGREES
    assert compare(fp32, int8).cosine_min >= BOUND
    assert "mlp-light:int8: this CPU's fused INT8 kernels do NOT compute" in log


def test_this_cpu_serves_int8_fused_exactly_where_its_kernels_agree_with_the_graph(
    quantized: Quantized, repository: Path
) -> None:
    config = f'[server]\nmodel_repository = "{repository}"\nmodels = ["mlp-light", "mlp-light:int8"]\n'
    daemon = start_daemon(config)
    try:
        with Client(daemon.ipc) as client:
            models = {m["name"]: m for m in client.models()}
            x = random_input("mlp-light", 32, seed=9)
            fp32, int8 = client.infer("mlp-light", x)["scores"], client.infer("mlp-light:int8", x)["scores"]
        log = daemon.log()
    finally:
        daemon.close()
    assert models["mlp-light"]["precision"] == "fp32" and "cpu_int8" not in models["mlp-light"]
    served = models["mlp-light:int8"]["cpu_int8"]
    assert models["mlp-light:int8"]["precision"] == "int8"
    assert served["kernels"] == ("fused" if served["fused_cosine_min"] >= AGREES else "unfused")
    assert served["fused_ms"] > 0 and served["unfused_ms"] > 0
    assert compare(fp32, int8).cosine_min >= BOUND
    assert "mlp-light:int8: this CPU's fused INT8 kernels" in log
