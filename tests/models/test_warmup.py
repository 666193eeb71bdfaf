"""Real models' warm-up and import: `edged import` from the ONNX metadata, warm-up
samples from the manifest, a failure that names the model and the fix (or, with
server.on_model_failure = "skip", the other models served), and a streaming model
whose state the client carries (batch in dimension 1, a 0-d scalar input).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from support import ENGINES, RunningDaemon, run_edged, short_dir
from support.stream_models import detector, padder, reshaper, run_in_process, set_warmup, streamer, tiny_image

from edged.client import AsyncClient, Client, Unavailable
from edged.models.repository import RepositoryError, entries_of
from edged.models.warmup import WarmupSample, one_size_warning, tiled
from edged.wire.codec import TensorSpec
from edged.wire.signature import Signature

StartDaemon = Callable[..., RunningDaemon]
CHUNK = 64


@pytest.fixture
def repository() -> Iterator[Path]:
    root = short_dir()
    shutil.copytree(ENGINES / "mlp-light", root / "mlp-light")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def imported(repository: Path, build: Callable[[Path], Path], *shapes: str) -> Path:
    """`edged import` of a model built by `build`, with warm-up shapes; the manifest's path."""
    source = build(repository.parent / f"{repository.name}-src" / "model.onnx")
    name = build.__name__
    args = ["import", str(source), "--name", name, "--repository", str(repository)]
    done = run_edged(*args, *(arg for shape in shapes for arg in ("--shape", shape)))
    assert done.returncode == 0, done.stderr
    return repository / name / "manifest.json"


def wait_exit(running: RunningDaemon, timeout_s: float = 60) -> int:
    end = time.monotonic() + timeout_s
    while running.alive() and time.monotonic() < end:
        time.sleep(0.05)
    assert not running.alive(), "the daemon kept running"
    return running.process.process.returncode


# --- import ----------------------------------------------------------------------


def test_import_writes_the_manifest_from_the_onnx_metadata(repository: Path) -> None:
    source = streamer(repository / "src" / "streamer.onnx")
    done = run_edged("import", str(source), "--repository", str(repository), "--shape", "input=1x64")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((repository / "streamer" / "manifest.json").read_text())
    assert manifest["inputs"] == [
        {"name": "input", "dtype": "float32", "shape": [-1, -1]},
        {"name": "state", "dtype": "float32", "shape": [2, -1, 4]},
        {"name": "sr", "dtype": "int64", "shape": []},
    ]
    assert manifest["outputs"] == [
        {"name": "output", "dtype": "float32", "shape": [-1, 1]},
        {"name": "stateN", "dtype": "float32", "shape": [2, -1, 4]},
    ]
    assert manifest["warmup"] == [{"shapes": {"input": [1, 64]}}]
    assert "checked: 'streamer' loads and warms up on input [1, 64], state [2, 1, 4], sr []" in done.stdout


def test_import_takes_a_sample_per_size_and_warmup_data(repository: Path) -> None:
    """An input's --shape repeated gives one warm-up sample per size (what a model whose
    cost follows its input is priced from); --data fills an input in every sample."""
    source = streamer(repository / "src" / "streamer.onnx")
    shapes = ("--shape", "input=1x64", "--shape", "input=1x256", "--data", "sr=16000", "--data", "input=random")
    done = run_edged("import", str(source), "--repository", str(repository), *shapes)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((repository / "streamer" / "manifest.json").read_text())
    data = {"sr": 16000, "input": "random"}
    assert manifest["warmup"] == [
        {"shapes": {"input": [1, 64]}, "data": data},
        {"shapes": {"input": [1, 256]}, "data": data},
    ]
    assert "warms up on input [1, 64], state [2, 1, 4], sr []; input [1, 256], state [2, 1, 4], sr [] (" in done.stdout
    assert "sizes:" not in done.stdout  # the sizes given are the sizes used: nothing chosen, nothing tried
    wrong = run_edged("import", str(source), "--repository", str(repository), "--data", "sr=fast", "--replace")
    assert wrong.returncode == 1 and "--data takes NAME=zeros, NAME=random or NAME=NUMBER" in wrong.stderr


def test_import_without_shapes_finds_sizes_the_model_accepts(repository: Path) -> None:
    """The reflect Pad refuses 1 sample (the old default) and 2; the ladder finds realistic ones."""
    source = padder(repository / "src" / "padder.onnx")
    done = run_edged("import", str(source), "--repository", str(repository))
    assert done.returncode == 0, done.stderr
    warmup = json.loads((repository / "padder" / "manifest.json").read_text())["warmup"]
    lengths = [sample["shapes"]["x"] for sample in warmup]
    assert len(lengths) >= 2 and all(batch == 1 and samples >= 256 for batch, samples in lengths), lengths
    assert "tried samples: 1 (refused), 2 (refused), 16, " in done.stdout
    assert "to choose others: --shape x=1x" in done.stdout


def test_the_ladder_climbs_past_the_metadatas_size_and_warms_up_there_too(repository: Path) -> None:
    """An image model exported at imgsz 320 with dynamic axes takes 640 as well: a client
    sending 640 is priced from a measured call, not a guess past 320."""
    source = detector(repository / "src" / "detector.onnx")
    done = run_edged("import", str(source), "--repository", str(repository))
    assert done.returncode == 0, done.stderr
    assert "tried pixels a side: 1 (refused), 2 (refused), 16, 64, 224, 320, 640\n" in done.stdout
    assert "warming up at 64, 320 and 640 pixels a side (the smallest realistic size it took, the largest and the" in (
        done.stdout
    )
    warmup = json.loads((repository / "detector" / "manifest.json").read_text())["warmup"]
    assert [sample["shapes"]["x"] for sample in warmup] == [[1, 3, 64, 64], [1, 3, 320, 320], [1, 3, 640, 640]]


def test_a_model_that_takes_only_tiny_sizes_is_refused_unless_asked(repository: Path) -> None:
    """Warmed up at 2x2 pixels, an image model's real inputs would be priced thousands of times too high."""
    source = tiny_image(repository / "src" / "tiny_image.onnx")
    done = run_edged("import", str(source), "--repository", str(repository))
    assert done.returncode == 1
    assert "the model accepts only 1 and 2 pixels a side, below what a real input has" in done.stderr
    assert "--allow-tiny-warmup" in done.stderr
    assert not (repository / "tiny_image").exists()
    allowed = run_edged("import", str(source), "--repository", str(repository), "--allow-tiny-warmup")
    assert allowed.returncode == 0, allowed.stderr
    warmup = json.loads((repository / "tiny_image" / "manifest.json").read_text())["warmup"]
    assert [sample["shapes"]["x"] for sample in warmup] == [[1, 3, 1, 1], [1, 3, 2, 2]]


def test_a_model_that_refuses_every_size_names_the_value_it_could_not_guess(repository: Path) -> None:
    source = reshaper(repository / "src" / "reshaper.onnx")
    done = run_edged("import", str(source), "--repository", str(repository))
    assert done.returncode == 1
    assert "the model refused every size tried (1, 2, 16, 64, 256, 512, 1024, 4096 and 16000 samples;" in done.stderr
    assert "k: 0-d, tried at 0, a value edged cannot guess: give --data k=VALUE" in done.stderr
    assert not (repository / "reshaper").exists()
    given = run_edged("import", str(source), "--repository", str(repository), "--data", "k=16")
    assert given.returncode == 0, given.stderr
    assert "tried samples: 1 (refused), 2 (refused), 16, 64, " in given.stdout


def test_a_warmup_the_model_refuses_leaves_the_folder_to_fix(repository: Path) -> None:
    source = padder(repository / "src" / "padder.onnx")
    done = run_edged("import", str(source), "--repository", str(repository), "--shape", "x=1x1")
    assert done.returncode == 1
    assert "model 'padder' failed to warm up on x [1, 1] (" in done.stderr
    assert "Pad reflect requires axis length" in done.stderr
    assert 'change "warmup" in ' + str(repository / "padder" / "manifest.json") in done.stderr
    # The folder stays, to be fixed by its key; a second import replaces it only when asked.
    assert (repository / "padder" / "manifest.json").is_file()
    again = run_edged("import", str(source), "--repository", str(repository), "--shape", "x=2x16")
    assert again.returncode == 1 and "--replace" in again.stderr
    fixed = run_edged("import", str(source), "--repository", str(repository), "--shape", "x=2x16", "--replace")
    assert fixed.returncode == 0, fixed.stderr


# --- warm-up samples -------------------------------------------------------------------


def test_warmup_keys_are_checked_and_named(repository: Path) -> None:
    manifest = imported(repository, padder, "x=1x8")
    set_warmup(manifest, [{"shapes": {"x": [1, 8, 2]}}])
    with pytest.raises(RepositoryError, match=r"warmup\[0\]\.shapes\.x = \[1, 8, 2\]: set it to 2 positive sizes"):
        entries_of(manifest, "onnxruntime")
    set_warmup(manifest, [{"shapes": {"x": [1, 8]}, "data": "missing.npz"}])
    with pytest.raises(RepositoryError, match=r"warmup\[0\]\.data\.x = 'missing.npz': no such file"):
        entries_of(manifest, "onnxruntime")
    set_warmup(manifest, [{"shapes": {"y": [1, 8]}}])
    with pytest.raises(RepositoryError, match=r"warmup\[0\]\.shapes names \['y'\]"):
        entries_of(manifest, "onnxruntime")


def test_warmup_data_from_a_file_beside_the_manifest(repository: Path) -> None:
    manifest = imported(repository, padder, "x=1x8")
    np.savez(manifest.parent / "warm.npz", x=np.arange(16, dtype=np.float32).reshape(2, 8))
    set_warmup(manifest, [{"shapes": {"x": [2, 8]}, "data": "warm.npz"}, {"shapes": {"x": [1, 4]}, "data": "random"}])
    first, second = entries_of(manifest, "onnxruntime")[0].samples
    np.testing.assert_array_equal(first.inputs()["x"], np.arange(16, dtype=np.float32).reshape(2, 8))
    assert second.inputs()["x"].shape == (1, 4) and second.inputs()["x"].std() > 0


def test_a_model_that_fails_warmup_stops_startup_naming_it_and_the_key(
    repository: Path, own_daemon: StartDaemon
) -> None:
    manifest = imported(repository, padder, "x=1x8")
    raw = json.loads(manifest.read_text())
    del raw["warmup"]
    manifest.write_text(json.dumps(raw))
    running = own_daemon(f'[server]\nmodel_repository = "{repository}"\n', wait=False)
    assert wait_exit(running) == 1
    log = running.log()
    assert "start-up failed: model 'padder' failed to warm up on x [1, 1] (" in log
    assert 'set "warmup": [{"shapes": {"x": [-1, -1]}}] in ' + str(manifest) in log
    assert 'or set server.on_model_failure = "skip" to serve the other models' in log


def test_skip_serves_the_other_models_and_shows_the_failed_one(repository: Path, own_daemon: StartDaemon) -> None:
    manifest = imported(repository, padder, "x=1x8")
    set_warmup(manifest, [{"shapes": {"x": [1, 1]}}])  # given, and refused by the model
    running = own_daemon(f'[server]\nmodel_repository = "{repository}"\non_model_failure = "skip"\n')
    with Client(running.ipc) as client:
        reply = client.infer_reply("mlp-light", {"x": np.zeros((1, 64), dtype=np.float32)})
        assert reply.outputs["scores"].shape == (1, 10)
        health = client.health()
        assert [m["name"] for m in client.models()] == ["mlp-light"]
        failed = client._request("models", lambda r: r.header["failed"])
        # Not loaded, so UNAVAILABLE as the protocol has it (not NOT_FOUND, an unknown model): its reason given.
        with pytest.raises(Unavailable, match=r"model 'padder' is not loaded \(model 'padder' failed to warm up"):
            client.infer("padder", {"x": np.zeros((1, 8), dtype=np.float32)})
    assert health["state"] == "serving"
    reason = health["failed_models"]["padder"]
    assert reason.startswith("model 'padder' failed to warm up on x [1, 1] (")
    assert f'change "warmup" in {manifest} to shapes and data it accepts' in reason
    assert failed == [{"name": "padder", "error": reason}]


# --- streaming, state carried by the client --------------------------------------------


@pytest.mark.parametrize("klass", ["realtime", "bulk"])
def test_a_streamed_model_with_state_in_dimension_1_equals_in_process(
    repository: Path, own_daemon: StartDaemon, klass: str
) -> None:
    """Two streams of 20 chunks each, interleaved: with batching on (bulk), requests must
    not be stacked along dimension 0, which is no batch here (state has 2 there)."""
    manifest = imported(repository, streamer, "input=1x64")
    running = own_daemon(f'[server]\nmodel_repository = "{repository}"\n')
    rng = np.random.default_rng(7)
    chunks = rng.standard_normal((2, 20, 1, CHUNK), dtype=np.float32)
    sr = np.array(16000, dtype=np.int64)
    expected_state = [np.zeros((2, 1, 4), dtype=np.float32) for _ in range(2)]
    served_state = [state.copy() for state in expected_state]
    model_file = manifest.parent / "model.onnx"

    async def stream() -> None:
        async with AsyncClient(running.ipc) as client:
            for step in range(20):
                # Both streams' chunks in flight at once: a batching class sees them side by side.
                replies = await asyncio.gather(
                    *(
                        client.infer_reply(
                            "streamer", {"input": chunks[s, step], "state": served_state[s], "sr": sr}, klass=klass
                        )
                        for s in range(2)
                    )
                )
                for s, reply in enumerate(replies):
                    output, expected_state[s] = run_in_process(
                        model_file, {"input": chunks[s, step], "state": expected_state[s], "sr": sr}
                    )
                    np.testing.assert_allclose(reply.outputs["output"], output, rtol=1e-4, atol=1e-4)
                    served_state[s] = reply.outputs["stateN"]
                    np.testing.assert_allclose(served_state[s], expected_state[s], rtol=1e-4, atol=1e-4)

    asyncio.run(stream())


def test_only_a_sized_model_warmed_up_at_one_size_is_warned_about() -> None:
    vad = Signature(
        (TensorSpec("input", "float32", (-1, -1)), TensorSpec("state", "float32", (2, -1, 4))),
        (TensorSpec("output", "float32", (-1, 1)),),
    )
    dtypes = {"input": "float32", "state": "float32"}
    chunk = WarmupSample({"input": (1, 512), "state": (2, 1, 4)}, dtypes)
    longer = WarmupSample({"input": (1, 1536), "state": (2, 1, 4)}, dtypes)
    assert "model 'vad' takes inputs of any size and warms up at one size (input [1, 512]" in one_size_warning(
        "vad", vad, (chunk,), None
    )
    assert one_size_warning("vad", vad, (chunk, longer), None) == ""
    demo = Signature((TensorSpec("x", "float32", (-1, 64)),), (TensorSpec("scores", "float32", (-1, 10)),))
    assert one_size_warning("mlp-light", demo, (WarmupSample({"x": (1, 64)}, {"x": "float32"}),), None) == ""


def test_a_sized_models_warmup_is_not_tiled_to_the_largest_batch() -> None:
    """Priced per row size, a batch of images needs no warm-up of its own; 16 rows of a
    large image would cost seconds of start-up per lane."""
    image = Signature((TensorSpec("x", "float32", (-1, 3, -1, -1)),), (TensorSpec("y", "float32", (-1, 1, -1, -1)),))
    sample = WarmupSample({"x": (1, 3, 32, 32)}, {"x": "float32"})
    assert [rows for _, rows in tiled(sample, image, max_batch=16)] == [1]
    demo = Signature((TensorSpec("x", "float32", (-1, 64)),), (TensorSpec("scores", "float32", (-1, 10)),))
    calls = tiled(WarmupSample({"x": (1, 64)}, {"x": "float32"}), demo, max_batch=16)
    assert [(inputs["x"].shape, rows) for inputs, rows in calls] == [((1, 64), 1), ((16, 64), 16)]


@pytest.mark.parametrize("name", [".", "..", "../escaped", "a/b"])
def test_an_import_name_that_is_no_folder_of_its_own_is_refused_and_nothing_removed(
    repository: Path, name: str
) -> None:
    """`--name . --replace` removed the whole repository (and `..` its parent) before writing."""
    inner = repository / "inner"
    inner.mkdir()
    shutil.copytree(ENGINES / "mlp-light", inner / "mlp-light")
    (repository / "beside.txt").write_text("kept")
    source = ENGINES / "mlp-light" / "model.onnx"
    done = run_edged("import", str(source), "--repository", str(inner), "--name", name, "--replace")
    assert done.returncode == 1 and f"--name {name!r} is not a model name" in done.stderr, done.stderr
    assert (inner / "mlp-light" / "manifest.json").is_file() and (repository / "beside.txt").is_file()
    assert not (repository / "escaped").exists() and not (inner / "a").exists()
