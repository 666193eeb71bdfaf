"""bench/pipeline.py builds its own repository (the demo models, the example ensemble,
a chain written by the bench) and measures the daemon on it: a change to the manifest
format or to the pipelines' figures breaks it where no other test looks. A short run."""

from __future__ import annotations

import json
from pathlib import Path

from support import run_bench


def test_the_pipeline_bench_runs_and_reports_both_pipelines_and_the_flood(tmp_path: Path) -> None:
    figures = tmp_path / "pipeline.json"
    short = ["--rounds", "1", "--per-round", "2", "--flood-s", "1", "--json", str(figures)]
    done = run_bench("pipeline.py", *short)
    results = json.loads(figures.read_text())
    for pipeline in ("light-chain", "demo-ensemble"):
        assert results["unloaded"][pipeline]["pipeline"]["n"] == 2
        assert f"{pipeline} (" in done.stdout
    assert results["loaded"]["streams"]["realtime"]["lost"] == 0
    assert "expired after admission" in done.stdout
