"""The OCR pipeline's Python steps (docs/examples/ocr-pipeline/ocr_steps.py), composed by hand
with ONNX Runtime, read what rapidocr-onnxruntime 1.4.4 reads, end to end.

No daemon: prepare -> PP-OCRv4 det -> boxes -> PP-OCRv4 rec -> decode, each model in a plain
InferenceSession, on every image of tests/support/ocr.py, against rapidocr's own
RapidOCR with its default settings and without its angle classifier (the steps have
none): the same texts, in the same order, in the same boxes within 2 pixels, with the
same scores (within 0.01 where there are more lines than rapidocr's recognition batch).

The steps module is imported from a copy in a folder of its own with the dictionary
written beside it, as a pipeline's folder holds them. The models and rapidocr come
from the wheel, downloaded once and cached (tests/support/public_models.py); without
the registry, or on a Python newer than the wheel supports (3.12), the tests skip.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from support.ocr import Reading, ocr_models, rapidocr, read_with_rapidocr, rendered_images, skip_unless_rapidocr_runs

STEPS = Path(__file__).resolve().parents[2] / "docs" / "examples" / "ocr-pipeline" / "ocr_steps.py"
BOX_TOLERANCE = 2.0  # pixels, each corner's x and y
# rapidocr recognizes the lines in batches of 6, each padded to its own widest line; the steps
# in one batch padded to the widest of all. Up to 6 lines the batches are the same tensor, and
# so are the scores; past 6, a line padded wider scores a little differently (by 4e-4 here).
REC_BATCH = 6
SCORE_TOLERANCE = {True: 1e-5, False: 0.01}  # by whether the lines fit one batch of rapidocr's
IMAGES = rendered_images()


@pytest.fixture(scope="module", autouse=True)
def _supported_python() -> None:
    skip_unless_rapidocr_runs()


@pytest.fixture(scope="module")
def models() -> tuple[Path, Path]:
    return ocr_models()


@pytest.fixture(scope="module")
def steps(models: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """ocr_steps.py loaded from its file in a pipeline-like folder, its dictionary beside it."""
    folder = tmp_path_factory.mktemp("ocr-pipeline")
    shutil.copy(STEPS, folder / STEPS.name)
    spec = importlib.util.spec_from_file_location("ocr_steps", folder / STEPS.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_dictionary(models[1])
    return module


@pytest.fixture(scope="module")
def sessions(models: tuple[Path, Path]) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    return tuple(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]) for path in models)


@pytest.fixture(scope="module")
def reference() -> Any:
    return rapidocr()


def read_with_steps(
    steps: ModuleType, sessions: tuple[ort.InferenceSession, ort.InferenceSession], image: np.ndarray
) -> Reading:
    """The pipeline by hand: each step given exactly its declared inputs, by keyword."""
    det, rec = sessions
    x = steps.prepare(image=image)["x"]
    assert x.dtype == np.float32 and x.shape[:2] == (1, 3) and x.shape[2] % 32 == 0 and x.shape[3] % 32 == 0
    (maps,) = det.run(None, {"x": x})
    found = steps.boxes(image=image, maps=maps)
    assert set(found) == {"quads", "crops"}
    quads, crops = found["quads"], found["crops"]
    assert quads.dtype == np.float32 and quads.shape[1:] == (4, 2)
    assert crops.dtype == np.float32 and crops.shape[0] == max(len(quads), 1) and crops.shape[1:3] == (3, 48)
    (probs,) = rec.run(None, {"x": crops})
    read = steps.decode(probs=probs, quads=quads)
    assert set(read) == {"texts", "scores", "boxes"}
    texts, scores, boxes = read["texts"], read["scores"], read["boxes"]
    assert texts.dtype == np.uint8 and scores.dtype == np.float32 and boxes.dtype == np.float32
    assert texts.shape[0] == scores.shape[0] == boxes.shape[0]
    return Reading(steps.texts_from_rows(texts), boxes, scores.tolist())


@pytest.mark.parametrize("name", IMAGES)
def test_steps_read_what_rapidocr_reads(name: str, steps: ModuleType, sessions: Any, reference: Any) -> None:
    image, lines = IMAGES[name]
    expected = read_with_rapidocr(reference, image)
    got = read_with_steps(steps, sessions, image)

    # The image is read at all (else agreeing would prove little): every line drawn is in rapidocr's
    # reading, which reads no spaces between words here.
    read = "".join(expected.texts).replace(" ", "")
    assert all(line.text.replace(" ", "") in read for line in lines), (lines, expected.texts)

    tolerance = SCORE_TOLERANCE[len(expected.texts) <= REC_BATCH]
    # Matched up by position: each of rapidocr's boxes with the nearest of ours, by their centres.
    assert len(got.texts) == len(expected.texts), (got.texts, expected.texts)
    for index, (text, box, score) in enumerate(zip(*expected, strict=True)):
        nearest = int(np.argmin(np.linalg.norm(got.boxes.mean(axis=1) - box.mean(axis=0), axis=1)))
        assert nearest == index, f"{text!r}: read as line {nearest} ({got.texts[nearest]!r}), not {index}"
        assert got.texts[index] == text
        assert np.abs(got.boxes[index] - box).max() <= BOX_TOLERANCE, (text, got.boxes[index].tolist(), box.tolist())
        assert got.scores[index] == pytest.approx(score, abs=tolerance)


@pytest.mark.parametrize(
    ("height", "width"),
    [
        (360, 480),  # upscaled to 736 on the shorter side
        (26, 150),  # 30 pixels or lower: letterboxed
        (40, 400),  # more than 8 times wider than high: letterboxed
        (12, 90),  # a side under 30: grown first
        (2100, 900),  # a side over 2000: shrunk first
        (60, 2400),  # shrunk first, then letterboxed
    ],
)
def test_prepare_is_rapidocrs_detector_input(height: int, width: int, steps: ModuleType, reference: Any) -> None:
    """prepare's x is the very tensor rapidocr gives its detector, for the paths its preprocessing takes."""
    image = np.random.default_rng(height * width).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    work, _, _ = reference.preprocess(np.ascontiguousarray(image[:, :, ::-1]))
    work, _ = reference.maybe_add_letterbox(work, {})
    expected = reference.text_det.get_preprocess(max(work.shape[:2]))(work)
    x = steps.prepare(image=image)["x"]
    assert x.shape == expected.shape and x.dtype == expected.dtype
    np.testing.assert_array_equal(x, expected)


def test_no_text(steps: ModuleType, sessions: Any) -> None:
    """A map with no text gives no quads and one blank line for the recognizer (which fails on an
    empty batch), whose reading decode leaves out."""
    image = np.full((320, 320, 3), 255, dtype=np.uint8)
    found = steps.boxes(image=image, maps=np.zeros((1, 1, 736, 736), dtype=np.float32))
    assert found["quads"].shape == (0, 4, 2)
    np.testing.assert_array_equal(found["crops"], np.zeros((1, 3, 48, 320), dtype=np.float32))
    (probs,) = sessions[1].run(None, {"x": found["crops"]})
    read = steps.decode(probs=probs, quads=found["quads"])
    assert read["texts"].shape == (0, 0) and read["scores"].shape == (0,) and read["boxes"].shape == (0, 4, 2)


def test_decode(steps: ModuleType) -> None:
    """Greedy CTC: runs of one class are one character, blanks (0) part them and are dropped,
    the last class is a space; a text whose mean probability is under 0.5 is dropped, and
    rows past the quads (the blank line of an empty batch) are not read."""
    characters = steps._dictionary()
    classes = len(characters) + 2
    a, b, chinese = (characters.index(c) + 1 for c in ("a", "b", "中"))
    space = classes - 1

    def row(sequence: list[int], probability: float) -> np.ndarray:
        out = np.full((len(sequence), classes), (1 - probability) / (classes - 1), dtype=np.float32)
        out[np.arange(len(sequence)), sequence] = probability
        return out

    probs = np.stack(
        [
            row([a, a, 0, a, b, space, space, chinese, 0, 0], 0.9),  # "aab 中"
            row([b, b, b, 0, 0, 0, 0, 0, 0, 0], 0.4),  # under 0.5: dropped
            row([0] * 10, 0.99),  # nothing read: dropped
            row([a, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.7),  # "a"
            row([b] * 10, 0.99),  # past the quads: not read
        ]
    )
    quads = np.arange(4 * 8, dtype=np.float32).reshape(4, 4, 2)
    read = steps.decode(probs=probs, quads=quads)
    assert steps.texts_from_rows(read["texts"]) == ["aab 中", "a"]
    assert read["texts"].shape == (2, len("aab 中".encode()))
    np.testing.assert_allclose(read["scores"], [0.9, 0.7], rtol=1e-6)
    np.testing.assert_array_equal(read["boxes"], quads[[0, 3]])
