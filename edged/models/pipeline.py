"""Pipelines: several models (and Python glue) behind one model name.

    engines/<pipeline>/pipeline.toml   its inputs, steps and outputs
    engines/<pipeline>/<module>.py     the Python steps it names, if any

A step is a model of the repository or a Python function (`module:function`, a file
beside the manifest, called with one numpy array per input and returning a dict of
arrays). Each step's inputs name a request input (`image`) or an earlier step's output
(`det.probability`); the steps form a graph with no cycle, and the steps of one wave
(all of whose inputs are ready together) may run at once. Everything is checked here,
at load: an error names the pipeline, the step and the key, and fails the pipeline
alone (`server.on_model_failure`), never the models it uses.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from edged.models.repository import ModelEntry, RepositoryError, Variant, read_specs
from edged.models.warmup import ModelFailure, WarmupError, read_warmup
from edged.wire.codec import TensorSpec
from edged.wire.signature import Signature
from edged.wire.tensors import DTYPES

BACKEND = "pipeline"  # what `models` shows as a pipeline's backend


class PipelineError(ModelFailure):
    """A pipeline that cannot be served; the message names the pipeline, the step and the key."""


@dataclass(frozen=True, slots=True)
class Ref:
    """Where a tensor comes from: a request input (`step` None) or a step's output."""

    step: str | None
    tensor: str

    def __str__(self) -> str:
        return self.tensor if self.step is None else f"{self.step}.{self.tensor}"


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    inputs: tuple[tuple[str, Ref], ...]  # (the model's input or the function's argument, its source)
    outputs: tuple[TensorSpec, ...]
    after: frozenset[str]  # the steps whose outputs it takes
    key: str  # its price's name in the lane's ServiceTimes: "pipeline/step"
    model: ModelEntry | None = None
    function: Callable[..., Mapping[str, np.ndarray]] | None = None
    python: str = ""  # the function's "module:function"

    @property
    def runner(self) -> str:
        """What runs it: its model's runner, or its own function."""
        return self.model.name if self.model is not None else f"{self.key}"

    @property
    def runs(self) -> str:
        """What it runs, as errors name it."""
        return f"model {self.model.name}" if self.model is not None else f"Python step {self.python}"

    def to_wire(self) -> dict[str, Any]:
        """The step as `models` lists it."""
        if self.model is not None:
            return {"name": self.name, "model": self.model.name}
        return {"name": self.name, "python": self.python}


@dataclass(frozen=True, slots=True)
class Pipeline:
    """A checked pipeline: its steps in waves (each wave's steps take only what the
    waves before it made; `steps` is their order, one that runs every step after the
    steps it takes from) and where each of its outputs comes from."""

    name: str
    waves: tuple[tuple[Step, ...], ...]
    outputs: tuple[tuple[str, Ref], ...]
    children: Mapping[str, tuple[Step, ...]] = field(init=False)  # by step: the steps that take from it

    def __post_init__(self) -> None:
        taking = {step.name: tuple(s for s in self.steps if step.name in s.after) for step in self.steps}
        object.__setattr__(self, "children", taking)

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(step for wave in self.waves for step in wave)

    @property
    def models(self) -> frozenset[str]:
        return frozenset(step.model.name for step in self.steps if step.model is not None)

    def tails(self, prices: Mapping[str, int]) -> dict[str, int]:
        """By step, the time from its start to the pipeline's end along the longest path
        on from it, each step taking its price and starting once what it takes is made."""
        tails: dict[str, int] = {}
        for step in reversed(self.steps):
            tails[step.name] = prices[step.name] + max((tails[c.name] for c in self.children[step.name]), default=0)
        return tails

    def span_ns(self, tails: Mapping[str, int]) -> int:
        """The whole pipeline's critical path: the sum along a chain, the longest of parallel branches."""
        return max(tails[step.name] for step in self.waves[0])

    def longest(
        self, prices: Mapping[str, int], tails: Mapping[str, int], start: Step | None = None
    ) -> list[tuple[Step, int]]:
        """The critical path from `start` (None: the pipeline's start), each step with
        the time it ends, counted from the start."""
        step = start or max(self.waves[0], key=lambda s: tails[s.name])
        chain, end = [], 0
        while True:
            end += prices[step.name]
            chain.append((step, end))
            after = self.children[step.name]
            if not after:
                return chain
            step = max(after, key=lambda s: tails[s.name])


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
    pipeline = Pipeline(name, _waves(name, where, steps), outputs)
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


def _waves(name: str, where: str, steps: dict[str, Step]) -> tuple[tuple[Step, ...], ...]:
    """The steps by wave: each after every step it takes from; a cycle is refused, named."""
    waves, done = [], set[str]()
    left = dict(steps)
    while left:
        ready = [step for step in left.values() if step.after <= done]
        if not ready:
            cycle = " -> ".join(sorted(left))
            raise PipelineError(name, f"pipeline {name!r} ({where}): the steps {cycle} wait on each other (a cycle)")
        waves.append(tuple(ready))
        done.update(step.name for step in ready)
        for step in ready:
            del left[step.name]
    return tuple(waves)
