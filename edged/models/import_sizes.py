"""`edged import` with no --shape: the sizes to warm a model up at, chosen and explained.

Each dynamic dimension is read first from its name ("batch", "height", "sequence",
"samples", ...), then from where it stands (dimension 0 is the batch; two side by side
in an image-like input are height and width; one between fixed dimensions, as in a
recurrent state [layers, batch, hidden], is a batch carried inside). The model's
metadata may name a real size ("imgsz", "max_length", "sample_rate"). The sizes
themselves are found by running the model on a ladder of them: those it accepts are
kept, and it warms up at two or three realistic ones, so that a model whose cost
follows its input's size is priced from real points, never from 1x1 pixels alone.
The metadata's size joins the ladder, which climbs on past it: a model exported at
320 pixels with dynamic axes takes 640 too, and a client that sends 640 is priced
from a measured call, not from a guess past 320. It is warmed up at that size too.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from edged.models.repository import RepositoryError
from edged.models.warmup import WarmupSample
from edged.wire.codec import TensorSpec

# Seconds the ladder may take in all, and one call past which it climbs no higher: the
# daemon runs each chosen size 5 times per lane at every start.
PROBE_BUDGET_S = 20.0
CALL_LIMIT_S = 1.0
RATE_GUESS = 16000  # speech models' usual sample rate

Probe = Callable[[dict[str, np.ndarray]], float]  # one call's seconds; raises where the model refuses


@dataclass(frozen=True, slots=True)
class Kind:
    """What a dimension measures: the sizes tried, and the least a real input has."""

    name: str
    ladder: tuple[int, ...]
    floor: int


# Floors: a real image is at least 64 pixels a side, a real text 16 tokens, real audio
# 256 samples (16 ms at 16 kHz, the shortest chunk streaming models take).
SPATIAL = Kind("pixels a side", (1, 2, 16, 64, 224, 320, 640), 64)
SEQUENCE = Kind("steps", (1, 2, 16, 64, 128, 256, 512), 16)
SAMPLES = Kind("samples", (1, 2, 16, 64, 256, 512, 1024, 4096, 16000), 256)

_WORDS = {
    "batch": {"batch", "batch_size", "bs", "n", "b", "num_batches"},
    SPATIAL.name: {"height", "width", "h", "w", "rows", "cols"},
    SEQUENCE.name: {"sequence", "seq", "seq_len", "length", "len", "tokens", "token", "time", "t", "frames", "steps"},
    SAMPLES.name: {"samples", "sample", "num_samples", "audio", "wav", "waveform"},
}
_KINDS = {kind.name: kind for kind in (SPATIAL, SEQUENCE, SAMPLES)}
_HINT_KEYS = {
    SPATIAL.name: ("imgsz", "image_size", "img_size", "input_size", "height", "width", "resolution"),
    SEQUENCE.name: ("max_length", "max_seq_len", "sequence_length", "seq_len", "context_length"),
    SAMPLES.name: ("chunk_size", "window_size_samples", "num_samples"),
}
_LABELS = {"": "a batch, held at 1", SPATIAL.name: "height and width", SEQUENCE.name: "a length"}
_RATE_NAMES = {"sr", "rate", "sample_rate", "sampling_rate"}


@dataclass(frozen=True, slots=True)
class SizePlan:
    """The warm-up samples chosen (as `--shape` would give them) and the data guessed."""

    samples: list[dict[str, list[int]]]
    data: dict[str, str | float]


def plan_sizes(
    model: onnx.ModelProto,
    inputs: list[TensorSpec],
    data: Mapping[str, str | float],
    probe: Probe,
    allow_tiny: bool,
    say: Callable[[str], None],
) -> SizePlan | None:
    """The sizes to warm up at, for a model with a dynamic dimension besides its batch
    (None for one without), each choice and its reason told to `say`; RepositoryError
    where no realistic size can be found."""
    names = {value.name: [dim.dim_param for dim in value.type.tensor_type.shape.dim] for value in model.graph.input}
    hints = _hints({prop.key.lower(): prop.value for prop in model.metadata_props})
    kinds, reasons = _read_dims(inputs, names)
    if not _used(kinds):
        return None
    for line in reasons:
        say(line)
    data = {**_guess_scalars(inputs, data, hints, say), **data}
    ladders = {name: _ladder(_KINDS[name], hints.get(name)) for name in _used(kinds)}
    rungs = _rungs(ladders)
    tried = _climb(rungs, inputs, kinds, data, probe)
    floors = {name: min(_KINDS[name].floor, hints.get(name, math.inf)) for name in ladders}
    accepted = [rung for rung, error in tried if error is None]
    realistic = [rung for rung in accepted if all(rung[name] >= floors[name] for name in rung)]
    say(f"  tried {_list(tried, ladders)}")
    if not accepted:
        raise RepositoryError(_refused_all(tried, inputs, data))
    if not realistic and not allow_tiny:
        raise RepositoryError(
            f"the model accepts only {_sizes(accepted)}, below what a real input has ({_sizes([floors])}): "
            "warmed up there alone, it would be priced for real inputs as many times dearer as they are larger, "
            "and shed in every class. Give the sizes it serves with --shape, or --allow-tiny-warmup to write it anyway"
        )
    named = [rung for rung in realistic if any(hints.get(name) == size for name, size in rung.items())]
    chosen = _pick(realistic or accepted, named[0] if named else None)
    between = "the metadata's" if named and len(chosen) > 2 else "one between"
    why = f"the smallest realistic size it took, the largest and {between}" if len(chosen) > 2 else "all it took"
    if not realistic:
        why = "below a real input's size: --allow-tiny-warmup was given"
    say(f"  warming up at {_sizes(chosen)} ({why})")
    samples = [_shapes(rung, inputs, kinds, every=False) for rung in chosen]
    example = " ".join(f"--shape {name}={'x'.join(map(str, shape))}" for name, shape in samples[-1].items())
    say(f"  to choose others: {example}, say, given once for each size")
    return SizePlan(samples, data)


def _read_dims(inputs: list[TensorSpec], names: dict[str, list[str]]) -> tuple[dict[str, dict[int, str]], list[str]]:
    """By input, by dynamic axis: the kind's name ("" for a batch, held at 1); and the lines saying why."""
    by_param: dict[str, str] = {}
    kinds: dict[str, dict[int, str]] = {}
    lines = ["sizes:"]
    for spec in inputs:
        params = names.get(spec.name, [""] * len(spec.shape))
        dynamic = [axis for axis, d in enumerate(spec.shape) if d == -1]
        found: dict[int, str] = {}
        reasons: dict[str, list[int]] = {}
        for axis in dynamic:
            param = params[axis]
            kind, why = _by_name(param)
            if kind is None and param in by_param:
                kind, why = by_param[param], f"as {param!r} elsewhere"
            if kind is None:
                kind, why = _by_place(spec, axis, dynamic)
            if param:
                by_param.setdefault(param, kind)
            found[axis] = kind
            reasons.setdefault(f"{_LABELS.get(kind, kind)} ({why})", []).append(axis)
        kinds[spec.name] = found
        if dynamic:
            said = "; ".join(f"{' and '.join(map(str, axes))}: {reason}" for reason, axes in reasons.items())
            lines.append(f"  {spec.name} {list(spec.shape)}: dimension {said}")
    return kinds, lines


def _by_name(param: str) -> tuple[str | None, str]:
    words = set(re.split(r"[^a-z0-9]+", param.lower())) | {param.lower()}
    for kind, known in _WORDS.items():
        if words & known:
            return ("" if kind == "batch" else kind), f"named {param!r}"
    return None, ""


def _by_place(spec: TensorSpec, axis: int, dynamic: list[int]) -> tuple[str, str]:
    shape = spec.shape
    if axis == 0 and len(shape) > 1:
        return "", "the first dimension"
    if 0 < axis < len(shape) - 1 and shape[axis - 1] != -1 and shape[axis + 1] != -1:
        return "", "between fixed ones, as in a state [layers, batch, hidden]"
    sizes = [a for a in dynamic if a > 0 or len(shape) == 1]
    if len(sizes) == 2 and sizes[1] == sizes[0] + 1 and len(shape) >= 3:
        return SPATIAL.name, "two side by side, in an image's place"
    if len(shape) <= 2 and spec.dtype.startswith("float"):
        return SAMPLES.name, "a float signal's length"
    return SEQUENCE.name, "the only one left"


def _hints(props: dict[str, str]) -> dict[str, int]:
    """Sizes the metadata names, by kind (and "rate"): the largest number under each key."""
    hints = {}
    for kind, keys in (*_HINT_KEYS.items(), ("rate", tuple(_RATE_NAMES))):
        numbers = [int(n) for key in keys if key in props for n in re.findall(r"\d+", props[key])]
        if numbers and max(numbers) > 0:
            hints[kind] = max(numbers)
    return hints


def _guess_scalars(
    inputs: list[TensorSpec], data: Mapping[str, str | float], hints: dict[str, int], say: Callable[[str], None]
) -> dict[str, str | float]:
    guesses: dict[str, str | float] = {}
    for spec in inputs:
        if spec.shape or spec.name in data or spec.name.lower() not in _RATE_NAMES:
            continue
        rate = hints.get("rate", RATE_GUESS)
        guesses[spec.name] = rate
        source = "the metadata's" if "rate" in hints else "a speech model's usual"
        say(f"  {spec.name} = {rate}: a 0-d input named as a sample rate, {source} (another: --data {spec.name}=8000)")
    return guesses


def _ladder(kind: Kind, hint: int | None) -> tuple[int, ...]:
    return kind.ladder if hint is None else tuple(sorted({*kind.ladder, hint}))


def _used(kinds: dict[str, dict[int, str]]) -> list[str]:
    return sorted({kind for by_axis in kinds.values() for kind in by_axis.values() if kind})


def _rungs(ladders: dict[str, tuple[int, ...]]) -> list[dict[str, int]]:
    """The ladders climbed side by side (a shorter one stays at its top)."""
    steps = max(len(ladder) for ladder in ladders.values())
    rungs = [{name: ladder[min(i, len(ladder) - 1)] for name, ladder in ladders.items()} for i in range(steps)]
    return [rung for i, rung in enumerate(rungs) if i == 0 or rung != rungs[i - 1]]


def _climb(
    rungs: list[dict[str, int]],
    inputs: list[TensorSpec],
    kinds: dict[str, dict[int, str]],
    data: Mapping[str, str | float],
    probe: Probe,
) -> list[tuple[dict[str, int], str | None]]:
    """Each rung with None where the model accepted it, else its error's first line; the
    climb stops past the time budget or after a call slower than CALL_LIMIT_S."""
    dtypes = {spec.name: spec.dtype for spec in inputs}
    start, tried = time.perf_counter(), []
    for rung in rungs:
        shapes = {name: tuple(shape) for name, shape in _shapes(rung, inputs, kinds, every=True).items()}
        scalars = {spec.name: tuple(spec.shape) for spec in inputs if spec.name not in shapes}
        try:
            seconds = probe(WarmupSample({**shapes, **scalars}, dtypes, data).inputs())
        except Exception as exc:
            tried.append((rung, (str(exc).strip().splitlines() or [type(exc).__name__])[0]))
            continue
        tried.append((rung, None))
        if seconds > CALL_LIMIT_S or time.perf_counter() - start > PROBE_BUDGET_S:
            break
    return tried


def _shapes(
    rung: dict[str, int], inputs: list[TensorSpec], kinds: dict[str, dict[int, str]], every: bool
) -> dict[str, list[int]]:
    """Each input's shape at `rung`: of every input with a dynamic dimension, or only of those
    sized by the rung (a manifest leaves the rest out: they take 1 for each)."""
    return {
        spec.name: [
            rung[kinds[spec.name][axis]] if d == -1 and kinds[spec.name][axis] else max(d, 1)
            for axis, d in enumerate(spec.shape)
        ]
        for spec in inputs
        if any(kinds[spec.name].values()) or (every and -1 in spec.shape)
    }


def _pick(rungs: list[dict[str, int]], named: dict[str, int] | None) -> list[dict[str, int]]:
    """The smallest, the largest and between them the metadata's size (`named`), or
    else the one nearest their geometric mean."""
    if len(rungs) <= 2:
        return rungs
    low, high = rungs[0], rungs[-1]
    if named is not None and named not in (low, high):
        return [low, named, high]
    middle = min(rungs[1:-1], key=lambda rung: abs(math.log(_size(rung)) - math.log(_size(low) * _size(high)) / 2))
    return [low, middle, high]


def _size(rung: dict[str, int]) -> float:
    return math.prod(rung.values())


def _sizes(rungs: list[dict[str, int]] | list[dict[str, float]]) -> str:
    names = list(rungs[0])
    text = [" / ".join(f"{rung[name]:g}" for name in names) for rung in rungs]
    joined = ", ".join(text[:-1]) + " and " + text[-1] if len(text) > 1 else text[0]
    return f"{joined} {' / '.join(names)}"


def _list(tried: list[tuple[dict[str, int], str | None]], ladders: dict[str, tuple[int, ...]]) -> str:
    marks = [
        " / ".join(str(rung[name]) for name in ladders) + ("" if error is None else " (refused)")
        for rung, error in tried
    ]
    untried = len(_rungs(ladders)) - len(tried)
    more = f"; {untried} larger not tried: the budget was spent" if untried else ""
    return f"{' / '.join(ladders)}: " + ", ".join(marks) + more


def _refused_all(tried: list[tuple[dict[str, int], str | None]], inputs: list[TensorSpec], data: Mapping) -> str:
    scalars = [spec.name for spec in inputs if not spec.shape and spec.name not in data]
    last = tried[-1][1]
    message = f"the model refused every size tried ({_sizes([rung for rung, _ in tried])}; the largest: {last})"
    if scalars:
        fills = ", ".join(f"--data {name}=VALUE" for name in scalars)
        return f"{message}. {', '.join(scalars)}: 0-d, tried at 0, a value edged cannot guess: give {fills}"
    return f"{message}: give the sizes it takes with --shape INPUT=1x...x..."
