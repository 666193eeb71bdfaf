"""Pipelines served by a real daemon over real sockets: answers equal to their steps run
in process, one deadline end to end (shed at arrival, or ended before a step that would
end late, naming the step), a failing step ending its own request alone, Python steps
on a lane's worker and never on the socket loop, and a bad pipeline failing alone."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest
from support import ENGINES, REPO_ROOT, Reference, RunningDaemon, short_dir, start_daemon, wait_for

from edged.client import Client
from edged.client.errors import DeadlineExceeded, Internal, InvalidArgument, Overloaded
from edged.serve.pricing import MAX_OVER_PRICE

DEMO = REPO_ROOT / "docs" / "examples" / "demo-ensemble"

# Test steps: `guard` refuses a NaN (a step that fails on one request's input) and says
# which thread ran it; `wait` sleeps for x[0, 0] seconds (a step dearer than its price);
# `meet` returns only once another branch has reached it too.
STEPS = """
import threading
import time

import numpy as np


def guard(x):
    if np.isnan(x).any():
        raise ValueError("refused: the input holds a NaN")
    if np.isinf(x).any():
        raise SystemExit("an infinity")  # ends a script; here it is one request's failure
    return {"x": x, "thread": np.frombuffer(threading.current_thread().name.encode(), np.uint8)}


def wait(x):
    time.sleep(float(x[0, 0]))
    return {"x": x}


def who(x):
    return {"thread": np.frombuffer(threading.current_thread().name.encode(), np.uint8)}


MEETING = threading.Barrier(2, timeout=10)


def meet(x):
    MEETING.wait()  # passes only with the other branch at the barrier at the same time
    return {"thread": np.frombuffer(threading.current_thread().name.encode(), np.uint8)}
"""

GUARDED = """
[inputs]
x = { dtype = "float32", shape = [-1, 64] }

[[steps]]
name = "guard"
python = "steps:guard"
inputs = { x = "x" }
outputs = { x = { dtype = "float32", shape = [-1, 64] }, thread = { dtype = "uint8", shape = [-1] } }

[[steps]]
name = "light"
model = "mlp-light"
inputs = { x = "guard.x" }

[outputs]
scores = "light.scores"
thread = "guard.thread"
"""

SLOW = """
[inputs]
x = { dtype = "float32", shape = [-1, 64] }

[[steps]]
name = "wait"
python = "steps:wait"
inputs = { x = "x" }
outputs = { x = { dtype = "float32", shape = [-1, 64] } }

[[steps]]
name = "light"
model = "mlp-light"
inputs = { x = "wait.x" }

[outputs]
scores = "light.scores"
"""

# `wait`, then `guard`: a step that fails after another took its time.
WAITED = SLOW.replace(
    'name = "light"\nmodel = "mlp-light"\ninputs = { x = "wait.x" }',
    """name = "guard"
python = "steps:guard"
inputs = { x = "wait.x" }
outputs = { x = { dtype = "float32", shape = [-1, 64] }, thread = { dtype = "uint8", shape = [-1] } }""",
).replace('scores = "light.scores"', 'x = "guard.x"')

PAIR = """
[inputs]
x = { dtype = "float32", shape = [-1, 64] }

[[steps]]
name = "left"
python = "steps:meet"
inputs = { x = "x" }
outputs = { thread = { dtype = "uint8", shape = [-1] } }

[[steps]]
name = "right"
python = "steps:meet"
inputs = { x = "x" }
outputs = { thread = { dtype = "uint8", shape = [-1] } }

[outputs]
left = "left.thread"
right = "right.thread"
"""


def pipeline(root: Path, name: str, manifest: str) -> None:
    (root / name).mkdir()
    (root / name / "pipeline.toml").write_text(manifest)
    (root / name / "steps.py").write_text(STEPS)


@pytest.fixture(scope="module")
def repository() -> Path:
    root = short_dir()
    for model in ("mlp-light", "cnn-heavy"):
        shutil.copytree(ENGINES / model, root / model)
    shutil.copytree(DEMO, root / "demo-ensemble")
    pipeline(root, "guarded", GUARDED)
    pipeline(root, "slow", SLOW)
    pipeline(root, "waited", WAITED)
    pipeline(root, "pair", PAIR)
    return root


@pytest.fixture(scope="module")
def served(repository: Path) -> RunningDaemon:
    running = start_daemon(f'[server]\nmodel_repository = "{repository}"\n')
    yield running
    running.close()


def ensemble_in_process(image: np.ndarray) -> np.ndarray:
    spec = importlib.util.spec_from_file_location("demo_ensemble_steps", DEMO / "ensemble.py")
    assert spec is not None and spec.loader is not None
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    reference = Reference()
    heavy = reference.run("cnn-heavy", {"image": image})
    light = reference.run("mlp-light", steps.pool(image))
    return steps.join(heavy, light)["probabilities"]


@pytest.mark.parametrize("klass", ["realtime", "standard", "bulk"])
def test_the_fan_out_ensemble_answers_as_its_steps_do_in_process(served: RunningDaemon, klass: str) -> None:
    image = np.random.default_rng(7).standard_normal((2, 3, 64, 64)).astype(np.float32)
    with Client(served.ipc) as client:
        # A deadline no busy box misses: this is about the outputs.
        reply = client.infer_reply("demo-ensemble", {"image": image}, klass=klass, deadline_ms=60_000)
    np.testing.assert_allclose(reply.outputs["probabilities"], ensemble_in_process(image), rtol=1e-5, atol=1e-6)
    timing = reply.header["timing_us"]
    assert timing["compute"] > 0 and timing["total"] >= timing["compute"]


def test_models_lists_a_pipeline_with_its_steps_and_stats_shows_each_steps_price(served: RunningDaemon) -> None:
    with Client(served.ipc) as client:
        entry = next(model for model in client.models() if model["name"] == "demo-ensemble")
        prices = client.stats()["classes"]["standard"]["prices"]
    assert entry["backend"] == "pipeline"
    assert entry["inputs"] == [{"name": "image", "dtype": "float32", "shape": [-1, 3, 64, 64]}]
    assert entry["outputs"] == [{"name": "probabilities", "dtype": "float32", "shape": [-1, 10]}]
    assert [step["name"] for step in entry["steps"]] == ["heavy", "pool", "light", "join"]
    assert entry["steps"][1] == {"name": "pool", "python": "ensemble:pool"}
    # Priced by size (a pipeline's dimension 0 is no batch): by the request's elements, as warmed up.
    for step in ("heavy", "pool", "light", "join"):
        assert prices[f"demo-ensemble/{step}"]["row_ms_by_elements"][str(3 * 64 * 64)] > 0


def test_a_pipeline_that_cannot_make_its_deadline_is_shed_at_arrival_naming_the_step(served: RunningDaemon) -> None:
    image = np.zeros((1, 3, 64, 64), dtype=np.float32)
    with Client(served.ipc) as client:
        before = client.stats()["classes"]["standard"]["completed"]
        with pytest.raises(Overloaded) as shed:
            client.infer("demo-ensemble", {"image": image}, klass="standard", deadline_ms=0.2)
        after = client.stats()["classes"]["standard"]["completed"]
    assert "pipeline 'demo-ensemble': step 'heavy' (model cnn-heavy) would end past the deadline" in str(shed.value)
    assert after == before  # nothing ran


@pytest.mark.parametrize(
    ("bad", "raised"),
    [(np.nan, "ValueError: refused: the input holds a NaN"), (np.inf, "SystemExit: an infinity")],
)
def test_a_failing_python_step_ends_its_own_request_alone_naming_the_step(
    served: RunningDaemon, bad: float, raised: str
) -> None:
    poisoned = np.full((1, 64), bad, dtype=np.float32)
    clean = np.ones((1, 64), dtype=np.float32)
    with Client(served.ipc) as client, Client(served.ipc) as other:
        with pytest.raises(Internal) as failed:
            client.infer("guarded", {"x": poisoned})
        answered = other.infer("guarded", {"x": clean})
        again = client.infer("guarded", {"x": clean})
    message = str(failed.value)
    assert f"step 'guard' (Python step steps:guard) failed: {raised}" in message
    expected = Reference().run("mlp-light", {"x": clean})
    np.testing.assert_allclose(answered["scores"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(again["scores"], expected, rtol=1e-5, atol=1e-6)
    assert served.alive()


def test_a_failed_steps_reply_counts_the_steps_that_ran_as_compute(served: RunningDaemon) -> None:
    """The INTERNAL reply of a pipeline whose step failed gave compute 0 whatever ran before it:
    its total then held time that was neither queue nor compute."""
    x = np.zeros((1, 64), dtype=np.float32)
    x[0, 0], x[0, 1] = 0.2, np.nan  # `wait` sleeps 200 ms, then `guard` refuses the NaN
    with Client(served.ipc) as client:
        with pytest.raises(Internal) as failed:
            client.infer("waited", {"x": x}, deadline_ms=60_000)
    timing = failed.value.reply.header["timing_us"]
    assert timing["compute"] >= 200_000 and timing["queue"] + timing["compute"] <= timing["total"], timing


@pytest.mark.parametrize("klass", ["realtime", "standard", "bulk"])
def test_python_steps_run_on_a_worker_of_the_class_never_on_the_socket_loop(served: RunningDaemon, klass: str) -> None:
    """realtime runs cheap requests on the loop's own thread (MainThread): a pipeline never."""
    with Client(served.ipc) as client:
        for _ in range(5):
            thread = client.infer("guarded", {"x": np.ones((1, 64), np.float32)}, klass=klass)["thread"]
            assert bytes(thread).decode().startswith(f"lane-{klass}-")


def test_a_step_that_would_end_past_the_deadline_ends_the_request_once_naming_it(served: RunningDaemon) -> None:
    x = np.zeros((1, 64), dtype=np.float32)
    x[0, 0] = 0.3  # the wait step sleeps 300 ms; warmed up on zeros, it is priced at next to nothing
    with Client(served.ipc) as client:
        with pytest.raises(DeadlineExceeded) as late:
            client.infer("slow", {"x": x}, klass="standard", deadline_ms=150)
        assert "step 'light' (model mlp-light) would end past the deadline" in str(late.value)
        # The steps that ran (the 300 ms wait) are compute, not queue: the worker took it at once.
        assert late.value.reply is not None
        timing = late.value.reply.header["timing_us"]
        assert timing["compute"] >= 300_000 and timing["queue"] < 100_000, timing
        assert timing["total"] >= timing["queue"] + timing["compute"], timing
        # The run cut short counts for the bound, at most at MAX_OVER_PRICE: hidden, the
        # slow runs a deadline cuts would leave the bound below the tail it keeps in hand.
        prices = client.stats()["classes"]["standard"]["prices"]["slow"]
        assert prices["bound_over_price"] == MAX_OVER_PRICE, prices
        # One reply, and the lane serves on: a quick request right after is answered.
        quick = client.infer("slow", {"x": np.zeros((1, 64), np.float32)}, klass="standard", deadline_ms=2000)
    assert quick["scores"].shape == (1, 10)


def test_branches_run_side_by_side_on_a_thread_beside_the_worker(served: RunningDaemon) -> None:
    """Each branch of `pair` waits at a barrier for the other: run one after the other,
    the first would wait 10 s and fail."""
    with Client(served.ipc) as client:
        threads = client.infer("pair", {"x": np.zeros((1, 64), np.float32)}, klass="bulk", timeout_ms=30_000)
    names = sorted(bytes(threads[side]).decode() for side in ("left", "right"))
    assert names[0].startswith("lane-bulk-") and names[1].startswith("pipeline-branch"), names


def test_a_bad_pipeline_fails_alone_and_its_models_serve_on(repository: Path, own_daemon) -> None:  # type: ignore[no-untyped-def]
    root = short_dir()
    for name in ("mlp-light", "guarded"):
        shutil.copytree(repository / name, root / name)
    pipeline(root, "broken", GUARDED.replace('model = "mlp-light"', 'model = "mlp-gone"'))
    running = own_daemon(f'[server]\nmodel_repository = "{root}"\non_model_failure = "skip"\n')
    with Client(running.ipc) as client:
        assert sorted(model["name"] for model in client.models()) == ["guarded", "mlp-light"]
        reason = client.health()["failed_models"]["broken"]
        assert client.infer("guarded", {"x": np.ones((1, 64), np.float32)})["scores"].shape == (1, 10)
    assert reason.startswith("pipeline 'broken' (")
    assert "step 'light': 'model' 'mlp-gone' is not served here" in reason


def test_a_bad_pipeline_stops_start_up_by_default_naming_it(repository: Path, own_daemon) -> None:  # type: ignore[no-untyped-def]
    root = short_dir()
    shutil.copytree(repository / "mlp-light", root / "mlp-light")
    pipeline(root, "broken", GUARDED.replace('x = "guard.x"', 'x = "guard.y"'))
    running = own_daemon(f'[server]\nmodel_repository = "{root}"\n', wait=False)
    wait_for(lambda: not running.alive(), 60, "the daemon to refuse to start")
    log = running.log()
    assert "pipeline 'broken' (" in log and "step 'light': inputs.x: step 'guard' makes no 'y'" in log
    assert 'or set server.on_model_failure = "skip" to serve the other models' in log


def test_a_hung_python_step_is_answered_by_the_watchdog_and_its_worker_replaced(
    repository: Path,
    own_daemon,  # type: ignore[no-untyped-def]
) -> None:
    running = own_daemon(f'[server]\nmodel_repository = "{repository}"\n[classes.standard]\nstuck_after_ms = 300\n')
    hung = np.zeros((1, 64), dtype=np.float32)
    hung[0, 0] = 3.0  # the wait step sleeps 3 s, ten times the watchdog's limit
    with Client(running.ipc) as client:
        with pytest.raises(Internal) as answered:
            client.infer("slow", {"x": hung}, klass="standard", deadline_ms=20_000, timeout_ms=10_000)
        assert "the backend call has not returned after 300 ms" in str(answered.value)
        wait_for(lambda: client.health()["lanes"]["standard"] == "ok", 10, "a new standard worker")
        # The lane serves on; how soon is not the point: on a busy box the new worker's first
        # call waited 216 ms, past the class's default deadline.
        quick = client.infer("slow", {"x": np.zeros((1, 64), np.float32)}, klass="standard", deadline_ms=10_000)
    assert quick["scores"].shape == (1, 10)
    assert "class standard: recovering: a backend call of slow has not returned after 300 ms" in running.log()


def test_a_reload_picks_up_a_changed_step_and_a_new_pipeline(repository: Path, own_daemon) -> None:  # type: ignore[no-untyped-def]
    root = short_dir()
    for name in ("mlp-light", "guarded"):
        shutil.copytree(repository / name, root / name)
    running = own_daemon(f'[server]\nmodel_repository = "{root}"\n')
    x = np.ones((1, 64), np.float32)
    with Client(running.ipc) as client:
        before = client.infer("guarded", {"x": x})["scores"]
        # The guard now passes on twice its input; and a second pipeline appears beside it.
        steps = root / "guarded" / "steps.py"
        steps.write_text(steps.read_text().replace('return {"x": x, "thread"', 'return {"x": x * 2, "thread"'))
        shutil.copytree(root / "guarded", root / "guarded-too")
        count = running.log().count("reloaded")
        os.kill(running.pid, signal.SIGHUP)
        wait_for(lambda: running.log().count("reloaded") > count, 60, "the reload")
        after = client.infer("guarded", {"x": x})["scores"]
        too = client.infer("guarded-too", {"x": x})["scores"]
    reference = Reference()
    np.testing.assert_allclose(before, reference.run("mlp-light", {"x": x}), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after, reference.run("mlp-light", {"x": 2 * x}), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(too, after, rtol=1e-6)


@pytest.fixture(scope="module")
def fake_gpu(repository: Path) -> Iterator[RunningDaemon]:
    """A daemon on tests/support/fake_gpu.py (a reserving backend on the CPU, whose
    "device memory" for CUDA IPC is a POSIX object), serving two pipelines."""
    root = short_dir()
    for name in ("mlp-light", "guarded"):
        shutil.copytree(repository / name, root / name)
    pipeline(root, "who", PAIR.replace("steps:meet", "steps:who"))
    saved = dict(os.environ)
    os.environ.update(EDGED_FAKE_GPU_FREE_MB="65536")
    try:
        program = [sys.executable, str(REPO_ROOT / "tests" / "support" / "fake_gpu.py")]
        config = f'[server]\nbackend = "fake-gpu"\nmodel_repository = "{root}"\n[shm]\nenabled = true\n'
        running = start_daemon(config, program=program)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield running
    running.close()


def test_on_a_gpu_backend_branches_run_in_turn_on_the_workers_thread_fake_gpu(fake_gpu: RunningDaemon) -> None:
    """A GPU runtime's per-thread state is made on the worker's thread: no branch thread there."""
    with Client(fake_gpu.ipc) as client:
        threads = client.infer("who", {"x": np.zeros((1, 64), np.float32)}, klass="bulk")
    names = {bytes(threads[side]).decode() for side in ("left", "right")}
    assert len(names) == 1 and names.pop().startswith("lane-bulk-")


def test_a_pipeline_refuses_an_input_in_device_memory_fake_gpu(fake_gpu: RunningDaemon) -> None:
    x = np.ones((1, 64), np.float32)
    memory = shared_memory.SharedMemory(name=f"edged-pipe-{os.getpid()}-{time.monotonic_ns()}", create=True, size=4096)
    try:
        np.frombuffer(memory.buf, np.float32, x.size)[:] = x.reshape(-1)
        with Client(fake_gpu.ipc) as client:
            region = client.register_cuda_ipc(memory.name.lstrip("/").encode().ljust(64, b"\0"), memory.size)
            with pytest.raises(InvalidArgument) as refused:
                client.infer("guarded", {"x": region.tensor(0, x.shape)})
            # The same input as a frame is served, and a model takes the region as before.
            assert client.infer("guarded", {"x": x})["scores"].shape == (1, 10)
            assert client.infer("mlp-light", {"x": region.tensor(0, x.shape)})["scores"].shape == (1, 10)
            client.unregister(region)
    finally:
        memory.unlink()
        memory.close()
    assert "pipeline 'guarded' takes its inputs in frames or POSIX shared memory, not in device memory" in str(
        refused.value
    )


def test_a_bulk_pipeline_waiting_its_turn_between_steps_is_not_taken_for_hung(
    repository: Path,
    own_daemon,  # type: ignore[no-untyped-def]
) -> None:
    """Bulk's pipeline ends its first step (0.2 s) while realtime runs one of 1.5 s: it waits
    its turn before the next, and that wait is no backend call. Timed as one, it passed bulk's
    1 s limit: INTERNAL, and the worker replaced."""
    classes = "[classes.realtime]\nstuck_after_ms = 10000\n[classes.standard]\n[classes.bulk]\nstuck_after_ms = 1000\n"
    running = own_daemon(f'[server]\nmodel_repository = "{repository}"\n{classes}')
    first, long = np.zeros((1, 64), dtype=np.float32), np.zeros((1, 64), dtype=np.float32)
    first[0, 0], long[0, 0] = 0.2, 1.5

    def infer(x: np.ndarray, klass: str) -> np.ndarray:
        with Client(running.ipc, timeout_ms=30_000) as client:
            return client.infer("slow", {"x": x}, klass=klass, deadline_ms=20_000)["scores"]

    with ThreadPoolExecutor(2) as pool, Client(running.ipc) as control:
        before = control.stats()["classes"]["bulk"]["backend_calls"]
        waiting = pool.submit(infer, first, "bulk")
        # Bulk's run under way (counted as it starts), so that bulk waits between its steps, not before the first.
        wait_for(lambda: control.stats()["classes"]["bulk"]["backend_calls"] > before, 10, "bulk's run to start")
        ahead = pool.submit(infer, long, "realtime")
        assert ahead.result().shape == (1, 10)
        assert waiting.result().shape == (1, 10)
    assert "recovering" not in running.log()
