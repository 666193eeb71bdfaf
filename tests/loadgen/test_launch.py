"""Launching another checkout's daemon for a before-and-after (edged.loadgen.launch)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support import REPO_ROOT

from edged.loadgen.launch import checkout_program


def test_another_checkouts_program_runs_that_checkouts_code_from_this_one(tmp_path: Path) -> None:
    """Run from this checkout's root, as the benchmarks are: `python -m edged` there
    found this checkout's package first, and both sides of a comparison ran it."""
    other = tmp_path / "edged"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "__main__.py").write_text("print('the other checkout')\n")
    done = subprocess.run(checkout_program(str(tmp_path)), cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "the other checkout"), done.stderr
