"""`edged import`: an ONNX file into the model repository, checked as a lane would load it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
        help='warm-up shape of an input with dynamic dimensions, repeatable ("INPUT=" for a 0-d scalar)',
    )
    importer.add_argument("--replace", action="store_true", help="overwrite a folder of that name")
    importer.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from edged.backends import backend_named
    from edged.config import default_repository
    from edged.config.classes import DEFAULT_CLASSES
    from edged.models.onnx_import import parse_shapes, write_folder
    from edged.models.repository import RepositoryError, entries_of
    from edged.models.warmup import ModelFailure
    from edged.serve.admission import ServiceTimes
    from edged.serve.worker import load_and_warm

    repository = args.repository or default_repository()
    name = args.name or args.model.stem
    try:
        manifest = write_folder(args.model, repository, name, parse_shapes(args.shape), args.replace)
        model = entries_of(manifest, "onnxruntime")[0]
    except RepositoryError as exc:
        print(f"edged: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {manifest.parent / model.variant.path.name} and {manifest}:")
    print(manifest.read_text())
    klass = DEFAULT_CLASSES[0]
    try:
        runner = load_and_warm(backend_named("onnxruntime"), model, klass, service := ServiceTimes())
    except ModelFailure as exc:
        print(f"edged: {exc}", file=sys.stderr)
        return 1
    runner.close()
    took_ms = service.estimate_ns(model.name) / 1e6
    shapes = "; ".join(sample.describe() for sample in model.samples)
    print(f"checked: {name!r} loads and warms up on {shapes} ({took_ms:.3f} ms a call on the CPU)")
    return 0
