"""`edged import`: an ONNX file into the model repository, checked as a lane would load it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from edged.models.import_sizes import Probe
    from edged.models.repository import ModelEntry
    from edged.serve.pricing import ServiceTimes


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    importer = commands.add_parser(
        "import", help="write a repository folder and manifest from an ONNX file, then check it loads and warms up"
    )
    importer.add_argument("model", type=Path, help="the .onnx file")
    importer.add_argument("--name", help="the model's name in the repository (default: the file's stem)")
    importer.add_argument("--repository", type=Path, help="the model repository (default: the built-in one)")
    importer.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="INPUT=1x512",
        help='warm-up shape of an input with dynamic dimensions ("INPUT=" for a 0-d scalar); repeat an input '
        "for one warm-up sample per size: a model whose cost follows its input is priced from them. Without "
        "it, the sizes are read from the model and found by trying a ladder of them",
    )
    importer.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="INPUT=16000",
        help='warm-up data of an input: "zeros" (the default), "random" or a number (a 0-d input such as a rate)',
    )
    importer.add_argument(
        "--allow-tiny-warmup",
        action="store_true",
        help="without --shape, write the manifest even where the model accepts no realistic size (an image "
        "of 64 pixels a side, 16 steps, 256 samples), only smaller ones, which price real inputs far too high",
    )
    importer.add_argument(
        "--pin",
        action="store_true",
        help="accept only the size given with --shape (once per input): each dynamic dimension after the first "
        "is written fixed in the manifest, so a request of another size is refused INVALID_ARGUMENT, naming it",
    )
    importer.add_argument("--replace", action="store_true", help="overwrite a folder of that name")
    importer.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from edged.backends import backend_named
    from edged.config import default_repository
    from edged.config.classes import default_classes
    from edged.models.import_sizes import plan_sizes
    from edged.models.onnx_import import check_free, input_specs, parse_data, parse_shapes, read_source, write_folder
    from edged.models.repository import RepositoryError, entries_of
    from edged.models.warmup import ModelFailure
    from edged.serve.lanes.warming import load_and_warm
    from edged.serve.pricing import ServiceTimes

    repository = args.repository or default_repository()
    name = args.name or args.model.stem
    try:
        samples, data = parse_shapes(args.shape), parse_data(args.data)
        if args.pin and len(samples) != 1:
            raise RepositoryError("--pin takes the one size to accept, given with --shape INPUT=1x3x320x320, once")
        source = read_source(args.model)
        check_free(repository, name, args.replace)
        if not samples:
            probe = _probe(name, args.model)
            plan = plan_sizes(source, input_specs(source), data, probe, args.allow_tiny_warmup, say=print)
            if plan is not None:
                samples, data = plan.samples, plan.data
        manifest = write_folder(args.model, source, repository, name, samples, data, args.replace, args.pin)
        model = entries_of(manifest, "onnxruntime")[0]
    except (RepositoryError, ModelFailure) as exc:
        print(f"edged: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {manifest.parent / model.variant.path.name} and {manifest}:")
    print(manifest.read_text())
    klass = default_classes()[0]
    try:
        runner = load_and_warm(backend_named("onnxruntime"), model, klass, service := ServiceTimes())
    except ModelFailure as exc:
        print(f"edged: {exc}", file=sys.stderr)
        return 1
    runner.close()
    shapes = "; ".join(sample.describe() for sample in model.samples)
    print(f"checked: {name!r} loads and warms up on {shapes} ({_costs(model, service)} a call on the CPU)")
    return 0


def _probe(name: str, path: Path) -> Probe:
    """One quiet CPU session, timing one call on each size tried."""
    from edged.backends.onnxruntime_cpu import cpu_session
    from edged.models.warmup import load_failure

    try:
        session = cpu_session(path, "fp32", quiet=True)
    except Exception as exc:
        raise load_failure(name, path, exc) from exc

    def call(inputs: dict[str, np.ndarray]) -> float:
        start = time.perf_counter_ns()
        session.run(None, inputs)
        return (time.perf_counter_ns() - start) / 1e9

    return call


def _costs(model: ModelEntry, service: ServiceTimes) -> str:
    """What a call costs by the warm-up's timing: per sample where the cost follows the input's size."""
    if not model.signature.sized:
        return f"{service.estimate_ns(model.name) / 1e6:.3f} ms"
    costs = []
    for sample in model.samples:
        inputs = sample.inputs()
        rows = model.signature.rows(inputs)
        costs.append(service.charge_ns(model.name, rows, model.signature.elements(inputs)) / 1e6)
    return ", ".join(f"{ms:.3f} ms" for ms in costs)
