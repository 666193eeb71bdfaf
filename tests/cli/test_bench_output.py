"""`edged bench` as a script or CI job runs it: its output piped, not on a terminal."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import RunningDaemon, run_edged

PROGRESS = re.compile(r"^ *\d+\.\d s  realtime: \d+ sent, \d+ ok; \d+ in flight$")


def test_progress_comes_a_line_at_a_time_when_not_on_a_terminal(daemon: RunningDaemon) -> None:
    bench = ["bench", "--endpoint", daemon.ipc, "--mix", "realtime:mlp-light:50", "--duration", "3"]
    done = subprocess.run(
        [sys.executable, "-m", "edged", *bench],
        capture_output=True,
        timeout=120,
        check=False,
    )
    # Bytes, not text: reading text would turn each carriage return into a newline.
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    assert "\r" not in stderr
    lines = stderr.splitlines()
    assert len(lines) >= 2 and all(PROGRESS.match(line) for line in lines), stderr
    stdout = done.stdout.decode()
    assert "step x1: offered 50 req/s for 3 s" in stdout
    # Beside each round trip, the daemon's own span of the same replies: above zero, below it.
    (row,) = [line.split() for line in stdout.splitlines() if line.startswith("realtime ")]
    p50, in_p50 = float(row[10]), float(row[14])
    assert 0 < in_p50 < p50, stdout


def test_png_without_matplotlib_exits_2_before_the_run() -> None:
    """A child whose `import matplotlib` fails, as where the bench extra is not installed;
    a run of ten minutes that had started would outlast the timeout."""
    code = "import sys; sys.modules['matplotlib'] = None; from edged.cli.commands import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, "bench", "--png", "/tmp/never.png", "--duration", "600"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "edged bench --png needs matplotlib, which is not installed: pip install 'edged[bench]' "
        "(from a checkout: pip install -e '.[bench]')"
    ]
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (
            ("--json", "/nonexistent/figures.json"),
            "--json /nonexistent/figures.json: its folder /nonexistent does not exist",
        ),
        (("--json", "/tmp"), "--json /tmp: is a folder: name a file"),
        (("--config", "/nonexistent/edged.toml"), "config file /nonexistent/edged.toml does not exist"),
    ],
)
def test_a_file_bench_cannot_use_is_refused_before_the_run(args: tuple[str, ...], phrase: str) -> None:
    """Found after the run before (a whole --duration spent; here 600 s, past the timeout),
    or, for --config, a traceback without the daemon's reason."""
    done = run_edged("bench", *args, "--duration", "600", timeout_s=120)
    assert done.returncode == 2 and phrase in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_daemon_bench_starts_that_fails_says_why_in_one_line(tmp_path: Path) -> None:
    """Its config is valid, but the daemon cannot serve it: the daemon's last line, not a traceback."""
    config = tmp_path / "edged.toml"
    config.write_text(f'[server]\nmodel_repository = "{tmp_path / "none"}"\n')
    done = run_edged("bench", "--config", str(config), "--duration", "600", timeout_s=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "the daemon exited with code 1 during start-up: " in done.stderr and "model_repository" in done.stderr
