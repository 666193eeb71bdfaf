"""A model's manifest pins the sizes it accepts: `edged import --pin` writes each dynamic
dimension after the batch fixed at the --shape given, and a request of another size is
refused INVALID_ARGUMENT, naming the input, the shape sent and the shape accepted, before
admission prices it (unpinned, a frame of an unseen size was priced by a guess and shed
OVERLOADED, which told a camera's client to lengthen its deadline). Real imports, a real
daemon, a real convolution."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from support import RawReply, RunningDaemon, connect, exchange, header, run_edged, short_dir
from support.stream_models import detector, run_in_process

from edged.client import Client

StartDaemon = Callable[..., RunningDaemon]
FRAME = np.random.default_rng(5).standard_normal((1, 3, 320, 320)).astype(np.float32)
WRONG = np.zeros((1, 3, 640, 640), dtype=np.float32)


@pytest.fixture
def repository() -> Iterator[Path]:
    root = short_dir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def import_detector(repository: Path, *options: str) -> tuple[Path, Path]:
    source = detector(repository.parent / f"{repository.name}-src" / "detector.onnx")
    done = run_edged("import", str(source), "--repository", str(repository), *options)
    assert done.returncode == 0, done.stderr
    return source, repository / "detector" / "manifest.json"


def wrong_frame(running: RunningDaemon) -> RawReply:
    """A 640x640 frame with a deadline no call can meet (admission sheds whatever it prices),
    in raw frames: the client's own deadline handling stays out of it."""
    spec = {"name": "x", "dtype": "float32", "shape": list(WRONG.shape)}
    with zmq.Context() as context, connect(context, running.ipc) as sock:
        request = header(id=1, model="detector", deadline_ms=0.01, inputs=[spec], **{"class": "realtime"})
        return exchange(sock, [request, WRONG.tobytes()])


def test_a_pinned_model_refuses_another_size_by_name_before_admission(
    repository: Path, own_daemon: StartDaemon
) -> None:
    source, manifest = import_detector(repository, "--shape", "x=1x3x320x320", "--pin")
    assert json.loads(manifest.read_text())["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 3, 320, 320]}]
    running = own_daemon(f'[server]\nmodel_repository = "{repository}"\n')
    with Client(running.ipc) as client:
        served = client.infer("detector", {"x": FRAME}, klass="realtime")
        np.testing.assert_allclose(served["y"], run_in_process(source, {"x": FRAME})[0], rtol=1e-5, atol=1e-5)
        wrong = wrong_frame(running)
        assert wrong.status == "INVALID_ARGUMENT", wrong.header
        assert "input 'x' has shape [1, 3, 640, 640]; the model takes [-1, 3, 320, 320]" in wrong.header["error"]
        assert client.stats()["classes"]["realtime"]["shed"]["deadline"] == 0


def test_unpinned_the_same_frame_reaches_admission(repository: Path, own_daemon: StartDaemon) -> None:
    """What the camera's client saw: the wrong size is served by the model, so it is priced."""
    import_detector(repository, "--shape", "x=1x3x320x320")
    running = own_daemon(f'[server]\nmodel_repository = "{repository}"\n')
    assert wrong_frame(running).status == "OVERLOADED"


def test_pin_takes_one_size_and_every_dynamic_input(repository: Path) -> None:
    source = detector(repository.parent / f"{repository.name}-src" / "detector.onnx")
    base = ("import", str(source), "--repository", str(repository), "--pin")
    two = run_edged(*base, "--shape", "x=1x3x320x320", "--shape", "x=1x3x640x640")
    assert two.returncode == 1 and "--pin takes the one size to accept" in two.stderr
    none = run_edged(*base, "--shape", "y=1x4")
    assert none.returncode == 1 and "--pin fixes 'x' [-1, 3, -1, -1] at the size given: add --shape x=1x3x1x1" in (
        none.stderr
    )
    assert not (repository / "detector").exists()
