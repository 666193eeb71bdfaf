"""The Python steps of the OCR pipeline: PP-OCRv4 text detection, then recognition.

    image --prepare--> x --det--> maps --boxes--> crops --rec--> probs --decode--> texts, scores, boxes
                                         (image)   quads ---------------------^

Each step is a plain function: keyword arguments of numpy arrays in, a dict of numpy
arrays out, deterministic and without state between calls. They reproduce the
end-to-end result of rapidocr-onnxruntime 1.4.4 with its default settings and without
its angle classifier (``use_cls=False``): the same preprocessing, the same DB
post-processing of the detector's map, the same reading order, line crops and CTC
decoding. See README.md beside this file for the wiring.

Texts leave the pipeline as UTF-8 bytes, one zero-padded uint8 row per text
(:func:`texts_from_rows` turns them back into strings). The recognizer's character
dictionary is read from ``ppocr_keys.txt`` beside this file, which
:func:`write_dictionary` writes once from the recognition model's metadata.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import cv2
import numpy as np
import pyclipper

# rapidocr's settings (its config.yaml), which these steps reproduce.
MAX_SIDE = 2000  # an image with a longer side is first shrunk to it...
MIN_SIDE = 30  # ...and one with a shorter side first grown to it (both to multiples of 32)
LETTERBOX_HEIGHT = 30  # an image this low or lower is padded above and below...
LETTERBOX_RATIO = 8  # ...and so is one more than this many times wider than high
DET_SIDE = 736  # the detector sees the image's shorter side at least this long
BIN_THRESHOLD = 0.3  # a map pixel above this is text
BOX_THRESHOLD = 0.5  # a candidate box whose mean probability is below this is dropped
MAX_CANDIDATES = 1000  # contours looked at, at most
UNCLIP_RATIO = 1.6  # how far a box grows: by its area times this over its perimeter
MIN_BOX_SIDE = 3  # pixels of the map: a shorter box is dropped (MIN_BOX_SIDE + 2 after growing)
ROW_TOLERANCE = 10  # pixels: boxes whose tops differ by less are on one line, read left to right
REC_HEIGHT = 48  # the recognizer's input height
REC_MIN_WIDTH = 320  # and its input width at least
MIN_SCORE = 0.5  # a text recognized with a lower mean probability is dropped

DICTIONARY_FILE = "ppocr_keys.txt"
DICTIONARY_KEY = "character"  # the recognition model's metadata entry that holds the dictionary


def prepare(image: np.ndarray) -> dict[str, np.ndarray]:
    """The detector's input for one image.

    image: uint8 [H, W, 3], RGB.
    Returns x: float32 [1, 3, h, w]: the image in BGR (the order the models were trained
    in), letterboxed where it is very wide, resized so that h and w are multiples of 32
    and the shorter is 736 (or, in a larger image, its side to the nearest multiple of
    32), and scaled to [-1, 1].
    """
    work, _ = _working_image(image)
    shorter = min(work.shape[:2])
    resized = _resize_to_32(work, DET_SIDE / shorter if shorter < DET_SIDE else 1.0)
    x = (resized.astype(np.float32) * np.float32(1 / 255) - np.float32(0.5)) / np.float32(0.5)
    return {"x": np.ascontiguousarray(x.transpose(2, 0, 1)[np.newaxis])}


def boxes(image: np.ndarray, maps: np.ndarray) -> dict[str, np.ndarray]:
    """The text lines the detector found: their boxes, and their crops as one recognizer batch.

    image: uint8 [H, W, 3], RGB: the pipeline's input, as given to `prepare`.
    maps: float32 [1, 1, h, w]: the detector's text probability map for `prepare`'s x.
    Returns
    - quads: float32 [n, 4, 2]: each line's corners (x, y) in the image's pixels,
      clockwise from the top left, in reading order (top to bottom, left to right);
    - crops: float32 [max(n, 1), 3, 48, W], W >= 320: each line cut out of the image
      (straightened), resized to 48 pixels high, scaled to [-1, 1] and padded with 0 on
      the right to the widest. With no line at all it holds one blank line, since the
      recognizer fails on an empty batch; `decode` reads only the first n rows.
    """
    work, (scale_y, scale_x, pad_top) = _working_image(image)
    found = _reading_order(_detect(maps, work.shape[0], work.shape[1]))
    lines = [_cut_out(work, quad) for quad in found]
    quads = np.array(found, dtype=np.float32).reshape(-1, 4, 2)
    # Back to the image's pixels: less the letterbox, times the resize, within the image.
    quads[:, :, 1] -= pad_top
    quads[:, :, 0] *= scale_x
    quads[:, :, 1] *= scale_y
    quads = np.maximum(quads, 0)
    quads[:, :, 0] = np.minimum(quads[:, :, 0], image.shape[1])
    quads[:, :, 1] = np.minimum(quads[:, :, 1], image.shape[0])
    return {"quads": quads, "crops": _recognizer_batch(lines)}


def decode(probs: np.ndarray, quads: np.ndarray) -> dict[str, np.ndarray]:
    """The texts, by greedy CTC decoding of the recognizer's output, and the boxes they are in.

    probs: float32 [m, T, C], m >= n: the recognizer's per-step character probabilities
      for `boxes`' crops (class 0 is CTC's blank, C - 1 a space, the others the dictionary's).
    quads: float32 [n, 4, 2]: `boxes`' quads.
    Returns, for each line recognized with a mean probability of at least 0.5, in reading order:
    - texts: uint8 [k, L]: the text in UTF-8, zero-padded to the longest (L may be 0);
    - scores: float32 [k]: the mean probability of its characters;
    - boxes: float32 [k, 4, 2]: its quad.
    """
    characters = _dictionary()
    if probs.shape[-1] != len(characters) + 2:
        raise ValueError(f"probs has {probs.shape[-1]} classes; the dictionary has {len(characters)} characters + 2")
    count = quads.shape[0]
    if probs.ndim != 3 or probs.shape[0] < count:
        raise ValueError(f"probs {list(probs.shape)} must be [m, T, C] with a row for each of the {count} quads")
    best = probs[:count].argmax(axis=2)
    confidence = probs[:count].max(axis=2)
    texts, scores, kept = [], [], []
    for row in range(count):
        # A character is a run of one class that is not the blank.
        keep = best[row] != 0
        keep[1:] &= best[row][1:] != best[row][:-1]
        classes = best[row][keep]
        score = float(confidence[row][keep].astype(np.float64).mean()) if classes.size else 0.0
        if score >= MIN_SCORE:
            texts.append("".join(characters[c - 1] if c <= len(characters) else " " for c in classes))
            scores.append(score)
            kept.append(row)
    encoded = [text.encode("utf-8") for text in texts]
    rows = np.zeros((len(encoded), max(map(len, encoded), default=0)), dtype=np.uint8)
    for row, data in enumerate(encoded):
        rows[row, : len(data)] = np.frombuffer(data, dtype=np.uint8)
    return {
        "texts": rows,
        "scores": np.array(scores, dtype=np.float32),
        "boxes": quads[kept].astype(np.float32).reshape(-1, 4, 2),
    }


def texts_from_rows(rows: np.ndarray) -> list[str]:
    """`decode`'s texts (uint8 [k, L], zero-padded UTF-8) as strings: for a client."""
    return [bytes(row).rstrip(b"\0").decode("utf-8") for row in np.asarray(rows, dtype=np.uint8)]


def write_dictionary(rec_model: str | Path, folder: str | Path | None = None) -> Path:
    """Write the recognizer's character dictionary (its metadata's "character") beside this module.

    Done once, when the pipeline is set up; `decode` reads the file on each call. Needs the
    onnx package (edged's own dependency), which the steps themselves do not.
    """
    import onnx

    model = onnx.load(str(rec_model), load_external_data=False)
    metadata = {entry.key: entry.value for entry in model.metadata_props}
    if DICTIONARY_KEY not in metadata:
        raise ValueError(f"{rec_model} has no {DICTIONARY_KEY!r} metadata: not a PP-OCR recognizer with its dictionary")
    target = Path(folder if folder is not None else Path(__file__).parent) / DICTIONARY_FILE
    target.write_bytes(metadata[DICTIONARY_KEY].encode("utf-8"))
    return target


def _dictionary() -> list[str]:
    """The recognizer's characters, one a line of the dictionary file, as rapidocr splits them."""
    path = Path(__file__).with_name(DICTIONARY_FILE)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: write it once with `python {Path(__file__).name} REC_MODEL.onnx` (write_dictionary)"
        )
    return path.read_bytes().decode("utf-8").splitlines()


def _resize_to_32(image: np.ndarray, ratio: float) -> np.ndarray:
    """The image resized by about ratio: each side times ratio, truncated, then to the nearest
    multiple of 32 (half-way to even, as Python's round goes)."""
    height, width = (int(round(int(side * ratio) / 32) * 32) for side in image.shape[:2])
    if height <= 0 or width <= 0:
        raise ValueError(f"an image of {image.shape[0]}x{image.shape[1]} pixels is too narrow to read")
    return cv2.resize(image, (width, height))


def _working_image(image: np.ndarray) -> tuple[np.ndarray, tuple[float, float, int]]:
    """The image the detector's map and the line crops refer to, and how to map it back.

    The image in BGR; shrunk (or grown) where a side is past MAX_SIDE (or MIN_SIDE); then
    letterboxed, black above and below, where it is low or very wide. Returns it with
    (original pixels per working pixel in y, the same in x, the letterbox's height).
    """
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be uint8 [H, W, 3] (RGB), not {image.dtype} {list(image.shape)}")
    work = np.ascontiguousarray(image[:, :, ::-1])
    if max(work.shape[:2]) > MAX_SIDE:
        work = _resize_to_32(work, MAX_SIDE / max(work.shape[:2]))
    if min(work.shape[:2]) < MIN_SIDE:
        work = _resize_to_32(work, MIN_SIDE / min(work.shape[:2]))
    scale_y, scale_x = image.shape[0] / work.shape[0], image.shape[1] / work.shape[1]
    height, width = work.shape[:2]
    pad_top = 0
    if height <= LETTERBOX_HEIGHT or width / height > LETTERBOX_RATIO:
        pad_top = int(abs(max(int(width / LETTERBOX_RATIO), LETTERBOX_HEIGHT) * 2 - height) / 2)
        work = np.pad(work, ((pad_top, pad_top), (0, 0), (0, 0)))
    return work, (scale_y, scale_x, pad_top)


def _detect(maps: np.ndarray, height: int, width: int) -> list[np.ndarray]:
    """DB post-processing: the text regions of the probability map as quadrilaterals.

    Each region of the thresholded (and dilated) map gives its minimum-area rectangle,
    kept when the map's mean inside it is high enough, then grown by UNCLIP_RATIO (the
    model is trained on shrunk regions) and scaled to the working image of height x width.
    Returns float32 [4, 2] quads, corners clockwise from the top left, whole pixels.
    """
    if maps.ndim != 4 or maps.shape[:2] != (1, 1):
        raise ValueError(f"maps must be float32 [1, 1, h, w], not {list(maps.shape)}")
    probability = maps[0, 0]
    map_h, map_w = probability.shape
    text = cv2.dilate((probability > BIN_THRESHOLD).astype(np.uint8), np.ones((2, 2), np.uint8))
    contours = cv2.findContours(text * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)[-2]
    found = []
    for contour in contours[:MAX_CANDIDATES]:
        quad, short_side = _min_area_quad(contour)
        if short_side < MIN_BOX_SIDE or _mean_inside(probability, quad) < BOX_THRESHOLD:
            continue
        grown = _grow(quad)
        if grown is None:
            continue
        quad, short_side = _min_area_quad(grown)
        if short_side < MIN_BOX_SIDE + 2:
            continue
        quad[:, 0] = np.clip(np.round(quad[:, 0] / map_w * width), 0, width)
        quad[:, 1] = np.clip(np.round(quad[:, 1] / map_h * height), 0, height)
        quad = _clockwise(quad.astype(np.int32).astype(np.float32))
        # Within the image, in whole pixels; a line 3 pixels or less across is no line.
        quad[:, 0] = np.clip(quad[:, 0], 0, width - 1).astype(np.int32)
        quad[:, 1] = np.clip(quad[:, 1], 0, height - 1).astype(np.int32)
        if int(np.linalg.norm(quad[0] - quad[1])) > 3 and int(np.linalg.norm(quad[0] - quad[3])) > 3:
            found.append(quad)
    return found


def _min_area_quad(points: np.ndarray) -> tuple[np.ndarray, float]:
    """The minimum-area rectangle around points: float32 [4, 2] (top left, top right,
    bottom right, bottom left, by x first) and its shorter side."""
    rectangle = cv2.minAreaRect(points)
    corners = cv2.boxPoints(rectangle)
    corners = corners[np.argsort(corners[:, 0], kind="stable")]
    left, right = corners[:2], corners[2:]
    top_left, bottom_left = (left[0], left[1]) if left[1, 1] > left[0, 1] else (left[1], left[0])
    top_right, bottom_right = (right[0], right[1]) if right[1, 1] > right[0, 1] else (right[1], right[0])
    return np.array([top_left, top_right, bottom_right, bottom_left], dtype=np.float32), min(rectangle[1])


def _mean_inside(probability: np.ndarray, quad: np.ndarray) -> float:
    """The mean of the map inside the quad (its corners truncated to whole pixels)."""
    map_h, map_w = probability.shape
    x0, x1 = (int(np.clip(v, 0, map_w - 1)) for v in (np.floor(quad[:, 0].min()), np.ceil(quad[:, 0].max())))
    y0, y1 = (int(np.clip(v, 0, map_h - 1)) for v in (np.floor(quad[:, 1].min()), np.ceil(quad[:, 1].max())))
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    cv2.fillPoly(mask, [(quad - np.array([x0, y0], dtype=np.float32)).astype(np.int32)], 1)
    inside = probability[y0 : y1 + 1, x0 : x1 + 1][mask.astype(bool)]
    return float(inside.mean(dtype=np.float64)) if inside.size else 0.0


def _grow(quad: np.ndarray) -> np.ndarray | None:
    """The quad offset outwards (round joins) by its area * UNCLIP_RATIO / its perimeter:
    int32 [k, 1, 2] points, or None where nothing is left."""
    corners = quad.astype(np.float64)
    x, y = corners[:, 0], corners[:, 1]
    area = abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))) / 2
    perimeter = float(np.linalg.norm(corners - np.roll(corners, -1, axis=0), axis=1).sum())
    if perimeter == 0:
        return None
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(quad, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    paths = offset.Execute(area * UNCLIP_RATIO / perimeter)
    points = [point for path in paths for point in path]
    return np.array(points, dtype=np.int32).reshape(-1, 1, 2) if points else None


def _clockwise(quad: np.ndarray) -> np.ndarray:
    """The corners as top left, top right, bottom right, bottom left: the two leftmost
    are the left side, the higher of each side its top."""
    by_x = quad[np.argsort(quad[:, 0], kind="stable")]
    left = by_x[:2][np.argsort(by_x[:2, 1], kind="stable")]
    right = by_x[2:][np.argsort(by_x[2:, 1], kind="stable")]
    return np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)


def _reading_order(quads: list[np.ndarray]) -> list[np.ndarray]:
    """Top to bottom by the top-left corner; then, among neighbours whose tops are within
    ROW_TOLERANCE pixels (one line), left to right."""
    ordered = sorted(quads, key=lambda quad: (quad[0, 1], quad[0, 0]))
    for index in range(1, len(ordered)):
        at = index
        while (
            at > 0
            and abs(ordered[at][0, 1] - ordered[at - 1][0, 1]) < ROW_TOLERANCE
            and ordered[at][0, 0] < ordered[at - 1][0, 0]
        ):
            ordered[at - 1], ordered[at] = ordered[at], ordered[at - 1]
            at -= 1
    return ordered


def _cut_out(work: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """The line inside quad, warped to an upright rectangle; turned a quarter counter-clockwise
    where it is 1.5 times higher than wide (vertical text)."""
    width = int(max(np.linalg.norm(quad[0] - quad[1]), np.linalg.norm(quad[2] - quad[3])))
    height = int(max(np.linalg.norm(quad[0] - quad[3]), np.linalg.norm(quad[1] - quad[2])))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    warp = cv2.getPerspectiveTransform(quad, target)
    line = cv2.warpPerspective(work, warp, (width, height), borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    return np.rot90(line) if line.shape[0] / line.shape[1] >= 1.5 else line


def _recognizer_batch(lines: list[np.ndarray]) -> np.ndarray:
    """The lines as one float32 [n, 3, 48, W] batch: each resized to 48 high keeping its
    aspect (at most W wide), scaled to [-1, 1], zero-padded on the right; W is 48 times the
    widest aspect ratio, and at least 320. One blank line where there are none."""
    ratio = max([REC_MIN_WIDTH / REC_HEIGHT, *(line.shape[1] / line.shape[0] for line in lines)])
    width = int(REC_HEIGHT * ratio)
    batch = np.zeros((max(len(lines), 1), 3, REC_HEIGHT, width), dtype=np.float32)
    for index, line in enumerate(lines):
        resized_w = min(math.ceil(REC_HEIGHT * line.shape[1] / line.shape[0]), width)
        resized = cv2.resize(line, (resized_w, REC_HEIGHT)).astype(np.float32).transpose(2, 0, 1)
        batch[index, :, :, :resized_w] = (resized / 255 - 0.5) / 0.5
    return batch


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {Path(__file__).name} REC_MODEL.onnx  (writes {DICTIONARY_FILE} beside this file)")
    print(write_dictionary(sys.argv[1]))
