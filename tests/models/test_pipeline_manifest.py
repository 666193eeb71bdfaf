"""A pipeline's manifest, checked at load: the demo ensemble reads as written, and each
mistake a user can make is refused with one sentence naming the pipeline, the step and
the key. Real model entries of the demo repository, no daemon."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from support import ENGINES, REPO_ROOT

from edged.models.pipeline import PipelineError
from edged.models.pipeline_manifest import read_pipeline
from edged.models.repository import discover

MODELS = {model.name: model for model in discover(ENGINES, "onnxruntime", ("cnn-heavy", "mlp-light"))}
DEMO = REPO_ROOT / "docs" / "examples" / "demo-ensemble"


def test_the_demo_ensemble_reads_as_a_fan_out_then_a_join() -> None:
    entry = read_pipeline(DEMO / "pipeline.toml", MODELS)
    assert entry.pipeline is not None
    waves = [[step.name for step in wave] for wave in entry.pipeline.waves]
    assert waves == [["heavy", "pool"], ["light"], ["join"]]
    assert entry.to_wire()["backend"] == "pipeline"
    assert [spec.name for spec in entry.signature.inputs] == ["image"]
    assert [(spec.name, spec.dtype, spec.shape) for spec in entry.signature.outputs] == [
        ("probabilities", "float32", (-1, 10))
    ]


def test_the_critical_path_is_the_sum_along_a_chain_and_the_longest_branch() -> None:
    pipeline = read_pipeline(DEMO / "pipeline.toml", MODELS).pipeline
    assert pipeline is not None
    prices = {"heavy": 10, "pool": 1, "light": 2, "join": 3}
    tails = pipeline.tails(prices)
    assert pipeline.span_ns(tails) == 13
    assert [(step.name, end) for step, end in pipeline.longest(prices, tails)] == [("heavy", 10), ("join", 13)]
    prices["light"] = 20  # the other branch is now the longer one
    tails = pipeline.tails(prices)
    assert pipeline.span_ns(tails) == 24
    assert [(step.name, end) for step, end in pipeline.longest(prices, tails)] == [
        ("pool", 1),
        ("light", 21),
        ("join", 24),
    ]
    assert tails["light"] == 23 and tails["join"] == 3


def edited(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


def replace_in(old: str, new: str) -> Callable[[str], str]:
    return lambda text: edited(text, old, new)


MISTAKES = {
    "an unknown model": (
        replace_in('model = "mlp-light"', 'model = "mlp-huge"'),
        r"step 'light': 'model' 'mlp-huge' is not served here",
    ),
    "a source that names no step": (
        replace_in('x = "pool.x"', 'x = "pol.x"'),
        r"step 'light': inputs.x = 'pol.x' names no step",
    ),
    "a source that names no pipeline input": (
        replace_in(
            'inputs = { image = "image" }\n\n[[steps]]\nname = "pool"',
            'inputs = { image = "img" }\n\n[[steps]]\nname = "pool"',
        ),
        r"step 'heavy': inputs.image = 'img' is no pipeline input",
    ),
    "an output a step does not make": (
        replace_in('x = "pool.x"', 'x = "pool.y"'),
        r"step 'light': inputs.x: step 'pool' makes no 'y'",
    ),
    "a dtype the model does not take": (
        replace_in('x = { dtype = "float32"', 'x = { dtype = "int32"'),
        r"step 'light': inputs.x = 'pool.x' is int32 \[-1, 64\]; model mlp-light takes float32 \[-1, 64\]",
    ),
    "a shape the model does not take": (
        replace_in("shape = [-1, 64] }", "shape = [-1, 32] }"),
        r"step 'light': inputs.x = 'pool.x' is float32 \[-1, 32\]; model mlp-light takes float32 \[-1, 64\]",
    ),
    "a model input left unwired": (
        replace_in('inputs = { x = "pool.x" }', 'inputs = { y = "pool.x" }'),
        r"step 'light': 'inputs' gives \['y'\]; model mlp-light takes \['x'\]",
    ),
    "a cycle": (
        replace_in('inputs = { image = "image" }\noutputs', 'inputs = { image = "join.probabilities" }\noutputs'),
        r"the steps join -> light -> pool wait on each other \(a cycle\)|the steps .* wait on each other",
    ),
    "a Python file that does not exist": (
        replace_in('python = "ensemble:pool"', 'python = "missing:pool"'),
        r"step 'pool': 'python' names .*missing.py, which does not exist",
    ),
    "a function the module lacks": (
        replace_in('python = "ensemble:pool"', 'python = "ensemble:pool2"'),
        r"step 'pool': .*ensemble.py has no function 'pool2'",
    ),
    "a function that cannot take the inputs": (
        replace_in('inputs = { heavy = "heavy.logits", light = "light.scores" }', 'inputs = { a = "heavy.logits" }'),
        r"step 'join': ensemble:join cannot take the inputs \['a'\]",
    ),
    "a Python step with no outputs declared": (
        replace_in('outputs = { x = { dtype = "float32", shape = [-1, 64] } }\n', ""),
        r"'steps.pool.outputs' must be a table",
    ),
    "a pipeline output from no step": (
        replace_in('probabilities = "join.probabilities"', 'probabilities = "joint.probabilities"'),
        r"outputs.probabilities = 'joint.probabilities' names no step",
    ),
    "a second step of one name": (
        replace_in('name = "join"', 'name = "pool"'),
        r"steps\[3\]: a second step named 'pool'",
    ),
    "a step with both a model and a function": (
        replace_in('model = "mlp-light"', 'model = "mlp-light"\npython = "ensemble:pool"'),
        r"step 'light': give one of 'model'",
    ),
    "TOML that does not parse": (replace_in("[outputs]", "[outputs"), r"cannot be read as TOML"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_mistake_in_the_manifest_is_refused_naming_the_pipeline_and_the_step(mistake: str, tmp_path: Path) -> None:
    edit, expected = MISTAKES[mistake]
    folder = tmp_path / "ensemble"
    shutil.copytree(DEMO, folder)
    manifest = folder / "pipeline.toml"
    manifest.write_text(edit(manifest.read_text()))
    with pytest.raises(PipelineError) as raised:
        read_pipeline(manifest, MODELS)
    assert raised.value.model == "ensemble"
    assert str(raised.value).startswith("pipeline 'ensemble'") or "cannot be read as TOML" in str(raised.value)
    assert re.search(expected, str(raised.value)), str(raised.value)


def test_a_step_module_that_fails_to_import_is_refused_with_its_error(tmp_path: Path) -> None:
    folder = tmp_path / "ensemble"
    shutil.copytree(DEMO, folder)
    (folder / "ensemble.py").write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(PipelineError, match=r"step 'pool': importing .*ensemble.py failed: RuntimeError: no GPU here"):
        read_pipeline(folder / "pipeline.toml", MODELS)
