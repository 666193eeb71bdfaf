"""bench/busy_stream.py streams short-deadline bulk requests at a daemon on a busy box and
counts what was admitted, what expired and what went unanswered: a short run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_bench

pytestmark = pytest.mark.slow


def test_the_busy_stream_bench_answers_every_request(tmp_path: Path) -> None:
    figures = tmp_path / "stream.json"
    run_bench("busy_stream.py", "--rounds", "1", "--seconds", "2", "--json", str(figures))
    (statuses,) = json.loads(figures.read_text())["edged"]
    assert set(statuses) <= {"OK", "OVERLOADED", "DEADLINE_EXCEEDED"}, statuses
    assert statuses.get("OK", 0) + statuses.get("OVERLOADED", 0) > 0, statuses
