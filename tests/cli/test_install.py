"""What each install gets: ONNX Runtime is an extra, `cpu` or `gpu`, because its two
builds write one `onnxruntime` folder and must never be installed together; with
neither, a command that needs it says so in one sentence."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest
from support import REPO_ROOT, short_dir

ROOT = REPO_ROOT
RUNTIMES = {"onnxruntime", "onnxruntime-gpu"}
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def runtimes_of(extras: str) -> set[str]:
    """The ONNX Runtime distributions that `pip install '.[extras]'` asks for."""
    wanted = list(PROJECT["dependencies"])
    for extra in filter(None, extras.split(",")):
        wanted += PROJECT["optional-dependencies"][extra]
    names = {re.match(r"[A-Za-z0-9._-]+", requirement).group().lower() for requirement in wanted}
    return names & RUNTIMES


@pytest.mark.parametrize(
    ("extras", "expected"),
    [
        ("", set()),
        ("cpu", {"onnxruntime"}),
        ("cpu,test", {"onnxruntime"}),
        ("gpu", {"onnxruntime-gpu"}),
        ("gpu,test", {"onnxruntime-gpu"}),
        ("test", set()),
        ("build,bench,prometheus", set()),
    ],
)
def test_each_install_asks_for_at_most_one_onnx_runtime(extras: str, expected: set[str]) -> None:
    assert runtimes_of(extras) == expected


def test_the_readme_commands_name_the_cpu_extra_and_ci_runs_the_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e '.[cpu]' && .venv/bin/edged demo" in readme
    test_command = "python3 -m venv .venv && .venv/bin/pip install -e '.[cpu,test]' && .venv/bin/pytest"
    assert test_command in readme
    assert f'step "{test_command}"' in (ROOT / ".ci" / "run").read_text()


def without_onnxruntime(*args: str) -> subprocess.CompletedProcess[str]:
    """`edged ARGS` in a child whose `import onnxruntime` fails, as where neither extra is installed."""
    code = "import sys; sys.modules['onnxruntime'] = None; from edged.cli.commands import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=False)


def test_serving_without_onnx_runtime_stops_in_one_sentence_naming_the_extras() -> None:
    done = without_onnxruntime("serve", "--endpoint", f"ipc://{short_dir()}/d.sock")
    assert done.returncode == 1
    assert "server.backend = 'onnxruntime' needs ONNX Runtime, which is not installed: pip install 'edged[cpu]'" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr


def test_a_build_step_without_onnx_runtime_says_so_in_one_line() -> None:
    done = without_onnxruntime("build", "quantize", "mlp-light", "--precision", "int8")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "edged build quantize: needs ONNX Runtime, which is not installed: pip install 'edged[cpu]' for the CPU "
        "default, or 'edged[gpu]' on a GPU box (from a checkout: pip install -e '.[cpu]')"
    ]
