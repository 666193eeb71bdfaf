"""bench/decision_steps.py calls each step of the serving decisions on the daemon's own
objects: a step whose interface changed would break the script, not only a figure."""

from __future__ import annotations

from support import run_bench


def test_the_decision_steps_bench_times_every_step() -> None:
    lines = run_bench("decision_steps.py", "--calls", "50").stdout.splitlines()
    figures = {line[:40].strip(): float(line[40:].split()[0]) for line in lines}
    assert len(figures) == 14, lines
    assert "admission (admit)" in figures and "decode (the fast decoder)" in figures
    assert all(us > 0 for us in figures.values()), figures
