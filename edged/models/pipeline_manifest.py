"""A pipeline's manifest, read and checked at load.

    engines/<pipeline>/pipeline.toml   its inputs, steps and outputs
    engines/<pipeline>/<module>.py     the Python steps it names, if any

Everything is checked here: names resolve, a model step's sources agree with its
model's inputs in dtype and shape, the steps have no cycle, the step modules import.
An error names the pipeline, the step and the key, and fails the pipeline alone
(`server.on_model_failure`), never the models it uses.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from edged.models.pipeline import BACKEND, Pipeline, PipelineError, Ref, Step, waves
from edged.models.repository import ModelEntry, RepositoryError, Variant, read_specs
from edged.models.warmup import ModelFailure, WarmupError, read_warmup
from edged.wire.codec import TensorSpec
from edged.wire.signature import Signature
from edged.wire.tensors import DTYPES


def discover_pipelines(
    manifests: list[Path], models: list[ModelEntry], fail: Callable[[ModelFailure], None]
) -> list[ModelEntry]:
    """The pipelines of `manifests` that can be served with `models`, each as the model
    entry clients name it by; each one that cannot goes to `fail`."""
    served = {model.name: model for model in models}
    entries = []
    for path in manifests:
        try:
            entry = read_pipeline(path, served)
        except PipelineError as exc:
            fail(exc)
            continue
        if entry.name in served:
            fail(PipelineError(entry.name, f"{path}: {entry.name!r} is already a model's name: rename the folder"))
            continue
        served[entry.name] = entry
        entries.append(entry)
    return entries


def read_pipeline(path: Path, models: Mapping[str, ModelEntry]) -> ModelEntry:
    """One pipeline.toml, checked against the models served."""
    where, folder = str(path), path.parent
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PipelineError(folder.name, f"{where}: cannot be read as TOML ({exc})") from None
    name = folder.name  # as server.models names it, before its manifest is read
    checker = _Checker(name, where, folder, models)
    inputs = checker.specs(raw.get("inputs"), "inputs")
    steps = checker.steps(raw.get("steps"), {spec.name: spec for spec in inputs})
    outputs = checker.outputs(raw.get("outputs"), steps)
    made = [(out, checker.spec_of(ref, steps)) for out, ref in outputs]
    signature = Signature(inputs, tuple(TensorSpec(out, spec.dtype, spec.shape) for out, spec in made), stacks=False)
    pipeline = Pipeline(name, waves(name, where, steps), outputs)
    try:
        warmup = read_warmup(raw, signature, folder, where)
    except WarmupError as exc:
        raise PipelineError(name, str(exc)) from None
    description = str(raw.get("description", ""))
    return ModelEntry(name, description, signature, Variant("-", BACKEND, folder), warmup, path, pipeline=pipeline)


class _Checker:
    """Reads one manifest's parts, each error naming the pipeline and the key."""

    def __init__(self, name: str, where: str, folder: Path, models: Mapping[str, ModelEntry]) -> None:
        self.name, self.where, self.folder, self.models = name, where, folder, models
        self.modules: dict[str, ModuleType] = {}  # the step modules imported, by name

    def fail(self, message: str) -> PipelineError:
        return PipelineError(self.name, f"pipeline {self.name!r} ({self.where}): {message}")

    def specs(self, raw: Any, key: str) -> tuple[TensorSpec, ...]:
        """A table of {dtype, shape} by tensor name, as TensorSpecs in order."""
        if not isinstance(raw, dict) or not raw:
            raise self.fail(f"'{key}' must be a table of {{dtype, shape}} by tensor name")
        listed = [{"name": name, **spec} if isinstance(spec, dict) else spec for name, spec in raw.items()]
        try:
            return read_specs({key: listed}, key, self.where)
        except RepositoryError as exc:
            raise self.fail(f"{key}: {str(exc).split(': ', 1)[1]} (dtypes: {sorted(DTYPES)})") from None

    def steps(self, raw: Any, inputs: dict[str, TensorSpec]) -> dict[str, Step]:
        if not isinstance(raw, list) or not raw:
            raise self.fail("'steps' must be a non-empty array of tables ([[steps]])")
        steps: dict[str, Step] = {}
        for i, item in enumerate(raw):
            step = self.step(i, item)
            if step.name in steps:
                raise self.fail(f"steps[{i}]: a second step named {step.name!r}")
            steps[step.name] = step
        for step in steps.values():
            for param, ref in step.inputs:
                self.check_source(step, param, ref, steps, inputs)
        return steps

    def step(self, i: int, raw: Any) -> Step:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise self.fail(f"steps[{i}] needs a 'name'")
        name = raw["name"]
        if "." in name or "/" in name:
            raise self.fail(f"step {name!r}: 'name' may hold neither '.' nor '/'")
        wired = raw.get("inputs")
        if not isinstance(wired, dict) or not wired or not all(isinstance(v, str) for v in wired.values()):
            raise self.fail(f"step {name!r}: 'inputs' must map each input to a source (INPUT or STEP.OUTPUT)")
        refs = tuple((param, _ref(source)) for param, source in wired.items())
        after = frozenset(ref.step for _, ref in refs if ref.step is not None)
        key = f"{self.name}/{name}"
        if ("model" in raw) == ("python" in raw):
            raise self.fail(f"step {name!r}: give one of 'model' (a model's name) or 'python' ('module:function')")
        if "model" in raw:
            model = self.models.get(raw["model"]) if isinstance(raw["model"], str) else None
            if model is None:
                raise self.fail(f"step {name!r}: 'model' {raw['model']!r} is not served here: {sorted(self.models)}")
            given, wanted = set(wired), {spec.name for spec in model.signature.inputs}
            if given != wanted:
                takes = f"model {model.name} takes {sorted(wanted)}"
                raise self.fail(f"step {name!r}: 'inputs' gives {sorted(given)}; {takes}")
            return Step(name, refs, model.signature.outputs, after, key, model=model)
        outputs = self.specs(raw.get("outputs"), f"steps.{name}.outputs")
        function = self.function(name, raw["python"], set(wired))
        return Step(name, refs, outputs, after, key, function=function, python=raw["python"])

    def function(self, step: str, target: Any, params: set[str]) -> Callable[..., Mapping[str, np.ndarray]]:
        """`module:function` from the pipeline's folder."""
        module_name, _, attr = target.partition(":") if isinstance(target, str) else ("", "", "")
        if not module_name.isidentifier() or not attr.isidentifier():
            raise self.fail(f"step {step!r}: 'python' must be 'module:function', a file beside the manifest")
        path = self.folder / f"{module_name}.py"
        module = self.modules.get(module_name) or self.module(step, module_name, path)
        function = getattr(module, attr, None)
        if not callable(function):
            raise self.fail(f"step {step!r}: {path} has no function {attr!r}")
        try:
            inspect.signature(function).bind(**dict.fromkeys(params))
        except TypeError as exc:
            raise self.fail(f"step {step!r}: {target} cannot take the inputs {sorted(params)}: {exc}") from None
        return function

    def module(self, step: str, module_name: str, path: Path) -> ModuleType:
        """Import a step module, afresh on every load (a reload picks up its changes) and
        once per pipeline (its steps share the module's state)."""
        if not path.is_file():
            raise self.fail(f"step {step!r}: 'python' names {path}, which does not exist")
        # A name of its own per pipeline: two pipelines' modules of one name never meet.
        unique = f"edged_pipeline_{self.name.replace('-', '_').replace(':', '_')}_{module_name}"
        spec = importlib.util.spec_from_file_location(unique, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module  # dataclasses and pickling look modules up by name
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise self.fail(f"step {step!r}: importing {path} failed: {type(exc).__name__}: {exc}") from None
        self.modules[module_name] = module
        return module

    def check_source(
        self, step: Step, param: str, ref: Ref, steps: dict[str, Step], inputs: dict[str, TensorSpec]
    ) -> None:
        """The source exists, and agrees with a model step's input in dtype and shape."""
        if ref.step is not None and ref.step not in steps:
            raise self.fail(f"step {step.name!r}: inputs.{param} = {str(ref)!r} names no step: {sorted(steps)}")
        if ref.step is None and ref.tensor not in inputs:
            raise self.fail(f"step {step.name!r}: inputs.{param} = {str(ref)!r} is no pipeline input: {sorted(inputs)}")
        source = self.spec_of(ref, steps, inputs, f"step {step.name!r}: inputs.{param}")
        if step.model is None:
            return
        wanted = next(spec for spec in step.model.signature.inputs if spec.name == param)
        if source.dtype != wanted.dtype or not _shapes_agree(source.shape, wanted.shape):
            raise self.fail(
                f"step {step.name!r}: inputs.{param} = {str(ref)!r} is {source.dtype} {list(source.shape)}; "
                f"model {step.model.name} takes {wanted.dtype} {list(wanted.shape)}"
            )

    def spec_of(
        self, ref: Ref, steps: dict[str, Step], inputs: dict[str, TensorSpec] | None = None, key: str = ""
    ) -> TensorSpec:
        if ref.step is None:
            assert inputs is not None
            return inputs[ref.tensor]
        found = next((spec for spec in steps[ref.step].outputs if spec.name == ref.tensor), None)
        if found is None:
            made = [spec.name for spec in steps[ref.step].outputs]
            raise self.fail(f"{key or 'outputs'}: step {ref.step!r} makes no {ref.tensor!r}: it makes {made}")
        return found

    def outputs(self, raw: Any, steps: dict[str, Step]) -> tuple[tuple[str, Ref], ...]:
        if not isinstance(raw, dict) or not raw or not all(isinstance(v, str) for v in raw.values()):
            raise self.fail("'outputs' must map each output's name to the step output it is (STEP.OUTPUT)")
        outputs = []
        for name, source in raw.items():
            ref = _ref(source)
            if ref.step not in steps:
                raise self.fail(f"outputs.{name} = {source!r} names no step: {sorted(steps)}")
            self.spec_of(ref, steps, key=f"outputs.{name}")
            outputs.append((name, ref))
        return tuple(outputs)


def _ref(source: str) -> Ref:
    step, dot, tensor = source.partition(".")
    return Ref(step, tensor) if dot else Ref(None, source)


def _shapes_agree(given: tuple[int, ...], wanted: tuple[int, ...]) -> bool:
    return len(given) == len(wanted) and all(g == w or -1 in (g, w) for g, w in zip(given, wanted))
