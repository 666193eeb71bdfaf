"""bench/gpu_verify.sh on a machine with no GPU: the budget the caller gives, steps under
their limits, results packed as they come so that a kill at any moment leaves a readable
OUT, UNSUPPORTED apart from failure, and the 5 calls of the plan rehearsed (--dry-run,
with stand-in wheel parts and the fake GPU backend of tests/support/dry_run). None of this
shows that a step passes on a GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from support import REPO_ROOT, wait_for

from edged.backends.cuda import cuda_available

VERIFY = REPO_ROOT / "bench" / "gpu_verify.sh"
NO_CUDA = cuda_available()
pytestmark = pytest.mark.skipif(NO_CUDA is None, reason="this machine has a CUDA device")


def verify(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(VERIFY), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHON": sys.executable, **env},
    )


def packed(archive: Path) -> dict[str, str]:
    """The files of a call's archive, by name, as text."""
    with tarfile.open(archive) as tar:
        return {Path(m.name).name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


def rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("| ") and "outcome" not in line]


def python_that(tmp_path: Path, matching: str, then: str) -> Path:
    """A python3 that runs `then` (shell) when its arguments match `matching`, else Python."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in {matching}) {then};; esac\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_gpu_verify_without_a_budget_refuses_to_start_naming_what_to_give() -> None:
    done = verify("first")
    assert done.returncode == 2 and "--budget SECONDS is required" in done.stderr


def test_gpu_verify_runs_the_steps_asked_for_each_failure_in_its_row_and_json(tmp_path: Path) -> None:
    """Only the steps named, each a row of the call's table with its log's last line; all
    in one archive beside the table (2 files a call). Here, with no GPU, the preflight
    reports the missing device in its JSON, the library check names what is missing
    before any session, and a check that needs the device says so in its JSON."""
    done = verify("second", "--budget", "100", "--out", str(tmp_path / "fresh"), GPU_VERIFY_SITE=str(tmp_path))
    assert done.returncode == 1 and rows(done.stdout) == [
        f"| installed | FAIL | 0 | no wheels in {tmp_path}: a fresh machine? make calls 1-4 again |"
    ]  # a machine handed back after call 4: nothing else tried
    (tmp_path / ".edged-installed").write_text("set 1\n")
    done = verify(
        "second",
        "--budget",
        "100",
        "--steps",
        "edges",
        "--out",
        str(tmp_path / "second"),
        GPU_VERIFY_SITE=str(tmp_path),
    )
    assert rows(done.stdout)[0].startswith("| edges | FAIL(1) |") and "needs a CUDA GPU" in rows(done.stdout)[0]
    assert '"outcome": "FAIL"' in packed(tmp_path / "second" / "gpu-verify-second.tar.gz")["gpu-checks-edges.json"]
    done = verify("first", "--budget", "100", "--steps", "preflight libs", "--out", str(tmp_path / "first"))
    assert done.returncode == 1, done.stdout + done.stderr
    table = rows(done.stdout)
    assert table[0].startswith("| preflight | FAIL(") and "device FAIL" in table[0]  # (1), or its limit on a loaded box
    assert table[1].startswith("| libs | FAIL(1) |") and "CUDA provider needs cuBLAS" in table[1]
    assert len(table) == 2
    assert sorted(p.name for p in (tmp_path / "first").iterdir()) == ["gpu-verify-first.md", "gpu-verify-first.tar.gz"]
    files = packed(tmp_path / "first" / "gpu-verify-first.tar.gz")
    assert {"preflight.log", "libs.log", "gpu-checks-preflight.json"} <= set(files) and "cuRAND" in files["libs.log"]
    assert '"gvisor": ' in files["gpu-checks-preflight.json"]  # uname -r, recorded first


def test_gpu_verify_a_step_that_hangs_ends_within_the_budget_and_one_unsupported_is_no_failure(
    tmp_path: Path,
) -> None:
    """A wedged step must not eat the call: it ends within the caller's budget, is marked,
    and what it printed comes back; a step that exits 3 (a feature the machine lacks) is
    UNSUPPORTED and fails nothing."""
    python = python_that(tmp_path, "*preflight*", "echo started; exec sleep 60")
    start = time.monotonic()
    done = verify("first", "--budget", "28", "--steps", "preflight", "--out", str(tmp_path / "a"), PYTHON=str(python))
    assert time.monotonic() - start < 28 + 10
    assert done.returncode == 1
    (row,) = rows(done.stdout)
    limit = int(row.split("FAIL(timeout ")[1].split(" s)")[0])  # the budget less what has gone, less 20 s
    assert limit <= 8 and done.stdout.rstrip().endswith("| started |")
    assert packed(tmp_path / "a" / "gpu-verify-first.tar.gz")["preflight.log"] == "started\n"
    python = python_that(tmp_path, "*preflight*", "echo 'preflight: UNSUPPORTED: no green contexts'; exit 3")
    done = verify("first", "--budget", "60", "--steps", "preflight", "--out", str(tmp_path / "b"), PYTHON=str(python))
    assert done.returncode == 0 and "| preflight | UNSUPPORTED |" in done.stdout


def killed_at(tmp_path: Path, name: str, ready: str) -> Path:
    """A call whose preflight prints `started` and hangs, killed with its whole process group
    (as the device tool ends a call at its limit) once `ready` holds; its OUT folder."""
    python = python_that(tmp_path, "*preflight*", "echo started; exec sleep 60")
    out = tmp_path / name
    out.mkdir()  # as the device tool's $OUT
    env = {**os.environ, "PYTHON": str(python), "GPU_VERIFY_PACK_S": "1", "OUT": str(out)}
    call = subprocess.Popen(
        ["bash", str(VERIFY), "first", "--budget", "100", "--steps", "preflight"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    archive = out / "gpu-verify-first.tar.gz"
    try:
        if ready == "at once":
            pass
        elif ready == "log packed":
            wait_for(lambda: archive.exists() and "started" in packed(archive).get("preflight.log", ""), 20, "packed")
    finally:
        os.killpg(call.pid, signal.SIGKILL)
        call.wait(10)
    return out


@pytest.mark.parametrize("moment", ["at once", "log packed"])
def test_gpu_verify_killed_at_any_moment_leaves_a_readable_out_with_all_that_was_packed(
    tmp_path: Path, moment: str
) -> None:
    """Whatever the moment of the kill, OUT holds whole files only (the archive is replaced,
    never rewritten in place), and a step's log written before the last repack is in it."""
    out = killed_at(tmp_path, "out", moment)
    archive = out / "gpu-verify-first.tar.gz"
    if archive.exists():
        files = packed(archive)  # raises on half an archive
        if moment == "log packed":
            assert files["preflight.log"] == "started\n"
    assert len([p for p in out.iterdir() if not p.name.startswith(".")]) <= 2


def test_gpu_verify_dry_run_rehearses_the_five_calls_installing_the_joined_parts(tmp_path: Path) -> None:
    """The plan's 5 calls, in order, here: 3 copy calls, the last part's call joining the
    stand-in parts, installing them and going on to `first`, then `second`; each call's
    OUT within 8 files and readable. Short: the install step only (the rest is the same
    step function, tested above)."""
    done = verify("--dry-run", "--budget", "120", "--steps", "install", "--out", str(tmp_path), timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parts: stand-ins of device-wheels' layout" in done.stdout or "parts: the real ones" in done.stdout
    summaries = [line for line in done.stdout.splitlines() if line.startswith("dry run: call ")]
    assert len(summaries) == 5 and all("archives readable: yes" in line for line in summaries)
    assert "| install | ok |" in (tmp_path / "call-4" / "gpu-verify-first.md").read_text()
    assert sorted(p.name for p in (tmp_path / "call-5").iterdir()) == [
        "gpu-verify-second.md",
        "gpu-verify-second.tar.gz",
    ]
    assert "edged_standin" in packed(tmp_path / "call-4" / "gpu-verify-first.tar.gz")["install.log"] or (
        "onnxruntime" in packed(tmp_path / "call-4" / "gpu-verify-first.tar.gz")["install.log"]
    )
